"""The sandbox child: four modules run as `python -I -B sandbox_main.py`, never imported by
the workbench (`workbench.dataenv.sandbox` starts it). They import nothing from the workbench,
and find each other through their own folder, which `sandbox_main` appends to `sys.path`."""
