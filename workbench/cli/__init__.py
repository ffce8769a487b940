"""The `workbench` command line: a thin shell over library calls."""
