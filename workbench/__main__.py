from workbench.cli.main import entry

entry()
