"""The faults are a layer outside the executable spec (reference_server/faults/), enforced.

No module of the server outside the layer mentions a fault, except the start-up that installs the ones asked for;
every fault of the catalogue wraps at least one named function of the server; installing faults and taking them
out again leaves the server's functions exactly as they were.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from reference_server.faults import FAULTS, active, install, installed, wraps_of
from reference_server.faults.patching import Wrap

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "reference_server"
LAYER = SERVER / "faults"
START_UP = SERVER / "__main__.py"  # parses --fault and installs the layer; the one place outside it that may
FAULT_WORD = re.compile(r"\bfault(s|y)?\b", re.IGNORECASE)


def test_no_server_module_outside_the_layer_mentions_a_fault() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(SERVER.rglob("*.py"))
        if LAYER not in path.parents and path != START_UP
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FAULT_WORD.search(line)
    ]
    assert offenders == []


def test_a_server_started_without_faults_never_imports_the_layer() -> None:
    code = (
        "import sys, reference_server.server, reference_server.__main__ as m; "
        "m.build_parser(); print(any(n.startswith('reference_server.faults') for n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_each_fault_wraps_named_functions_of_the_server(name: str) -> None:
    wraps = wraps_of(name)
    assert wraps, f"{name} wraps nothing"
    for wrap in wraps:
        assert wrap.target.startswith("reference_server."), wrap.target
        assert Path(sys.modules[wrap.wrapper.__module__].__file__ or "").parent == LAYER


def _places(wrap: Wrap) -> dict[str, object]:
    """Every binding of the function ``wrap`` replaces, in every loaded server module and on its owner."""
    owner = wrap.owner
    original = owner.__dict__[wrap.attr] if isinstance(owner, type) else getattr(owner, wrap.attr)
    found: dict[str, object] = {wrap.target: original}
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("reference_server.") and not module_name.startswith("reference_server.faults"):
            for attr, value in vars(module).items():
                if value is original:
                    found[f"{module_name}.{attr}"] = value
    return found


def test_install_rebinds_every_use_and_taking_out_restores_them() -> None:
    import reference_server.routes.worker.workflow_tasks as routes
    import reference_server.workflow_tasks as wt

    original = wt.claim_workflow_task
    assert routes.claim_workflow_task is original  # imported by name: must see the fault too
    with installed(["throttled-reported-empty"]):
        assert active() == frozenset({"throttled-reported-empty"})
        assert wt.claim_workflow_task is not original
        assert routes.claim_workflow_task is wt.claim_workflow_task
        assert wt.claim_workflow_task.__wrapped__ is original  # type: ignore[attr-defined]
    assert wt.claim_workflow_task is original
    assert routes.claim_workflow_task is original
    assert active() == frozenset()


def test_every_fault_installs_and_leaves_nothing_behind() -> None:
    wraps = [wrap for name in FAULTS for wrap in wraps_of(name)]
    before = {key: value for wrap in wraps for key, value in _places(wrap).items()}
    undo = install(FAULTS)
    try:
        missing = [wrap.target for wrap in wraps if _places(wrap)[wrap.target] is before[wrap.target]]
        assert missing == [], "wraps not put in place"
    finally:
        undo()
    after = {key: value for wrap in wraps for key, value in _places(wrap).items()}
    assert after == before


def test_a_second_set_is_refused_while_one_is_installed() -> None:
    with installed(["drop-poll-status"]), pytest.raises(RuntimeError, match="drop-poll-status"):
        install(["bare-worker-errors"])
    with pytest.raises(KeyError, match="no-such-fault"):
        install(["no-such-fault"])
