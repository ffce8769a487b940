"""One way to pass a config everywhere: the CONFIG argument, with -c/--config as its alias
(`workbench.cli_options`), in every group; two different configs at once are refused."""

from conftest import REPO

FED = str(REPO / "configs" / "fed_demo.yaml")
OTHER = str(REPO / "configs" / "fed_knowledge.yaml")


def test_fed_takes_the_config_as_argument_or_as_option(cli, tmp_path):
    (tmp_path / "dep").mkdir()
    home = str(tmp_path / "dep")
    by_arg = cli("fed", "status", FED, "--home", home)
    by_opt = cli("fed", "status", "-c", FED, "--home", home)
    assert by_arg.returncode == by_opt.returncode == 0, by_arg.stderr + by_opt.stderr
    assert by_arg.stdout == by_opt.stdout
    same = cli("fed", "status", FED, "--config", FED, "--home", home)
    assert same.returncode == 0
    two = cli("fed", "status", FED, "-c", OTHER, "--home", home)
    assert two.returncode == 2 and "the config is given twice" in two.stderr


def test_trajsynth_and_rag_take_the_config_argument_too(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("trajsynth:\n  pool:\n    per_template: nope\n")
    for args in (("trajsynth", "tasks", "chinook", str(cfg), "-o", str(tmp_path / "t")),
                 ("trajsynth", "tasks", "chinook", "-c", str(cfg), "-o", str(tmp_path / "t")),
                 ("rag", "build", "datasets/rf", str(cfg), "-o", str(tmp_path / "i"))):
        r = cli(*args)
        # the config was read (and its bad value named) whichever way it was given
        assert r.returncode == 2 and "per_template" in r.stderr, (args, r.stderr)
    assert not (tmp_path / "t").exists() and not (tmp_path / "i").exists()


def test_every_group_spells_the_shared_options_the_same_way():
    import typer.main

    from workbench.cli.main import app

    click_app = typer.main.get_command(app)
    seen = []

    def visit(cmd, name):
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            visit(sub, f"{name} {sub_name}")
        for p in getattr(cmd, "params", ()):
            if "--set" in getattr(p, "opts", ()):
                assert "-s" in p.opts, name
            if "--config" in getattr(p, "opts", ()) or "-c" in getattr(p, "opts", ()):
                assert set(p.opts) >= {"--config", "-c"}, name
                seen.append(name)
            if p.name == "config" and p.param_type_name == "argument":
                seen.append(name)
    visit(click_app, "workbench")
    assert any("fed sim" in s for s in seen) and any("trajsynth tasks" in s for s in seen)


def test_help_explains_the_config_argument(cli):
    # click 8.5 with typer 0.20 printed "config [CONFIG]" with no text (pinned below 8.5)
    for args in (("loop", "plan"), ("distill", "run"), ("fed", "sim")):
        r = cli(*args, "--help")
        assert r.returncode == 0 and "Experiment YAML config" in r.stdout, (args, r.stdout)
