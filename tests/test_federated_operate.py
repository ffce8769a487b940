"""`workbench fed up|run` as library functions (`workbench.federated.operate`): the shell
prints, the library decides. The deployment itself runs in the full tier
(tests/test_federated_deploy.py); these check the decisions without one."""

import json

import pytest

from workbench.errors import WorkbenchError
from workbench.federated.config import FederatedConfig
from workbench.federated.deploy import DeployError
from workbench.federated.operate import (DeployedRun, RunFailed, bring_up, check_outcome,
                                         deployment, run_rounds)


def test_a_deployment_without_tls_is_refused_before_anything_is_written(tmp_path):
    fc = FederatedConfig()
    d = deployment(fc, tmp_path / "home")
    with pytest.raises(DeployError, match="no TLS certificates: pass --certs"):
        bring_up(fc, d, tmp_path / "sites")
    with pytest.raises(DeployError, match="--auth needs --certs"):
        deployment(fc, tmp_path / "home", auth=True)
    assert not (tmp_path / "home").exists()


def test_run_needs_a_running_superlink(tmp_path):
    fc = FederatedConfig()
    d = deployment(fc, tmp_path / "home", insecure=True)
    with pytest.raises(DeployError, match="no SuperLink runs from .*fed up --home"):
        run_rounds(fc, d, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_aborted_or_unfinished_run_fails_with_the_servers_exit_code(tmp_path):
    d = deployment(FederatedConfig(), tmp_path / "home", insecure=True)
    out = tmp_path / "srv"
    out.mkdir()
    check_outcome(DeployedRun(run_id=1, out=out, status="finished:completed"), d)
    with pytest.raises(RunFailed, match="the run ended finished:failed: see .*logs") as e:
        check_outcome(DeployedRun(run_id=1, out=out, status="finished:failed"), d)
    assert e.value.exit_code == 1
    (out / "abort.json").write_text(json.dumps({"message": "3 of the 4 required sites",
                                                "exit_code": 4}))
    with pytest.raises(RunFailed, match="3 of the 4 required sites") as e:
        check_outcome(DeployedRun(run_id=2, out=out, status="finished:failed"), d)
    assert e.value.exit_code == 4 and isinstance(e.value, WorkbenchError)
