"""The environment check strict where it matters (issue 36, part 6), by hand: on a multi-GPU launch an NCCL_*
variable nothing could verify in a server process fails the check, and NCCL's own evidence fails the start by
default; what the checks verified is said in one line (`spectrial.servers.envcheck.verified`) that the headline shows; the
README says where `nccl_evidence_check` is documented, and it is documented there. The real runs are in
tests/engines/test_sglang_standin_trial.py (the SGLang test double, setproctitle included)."""

from __future__ import annotations

import re
from pathlib import Path

from spectrial.engines import get_engine
from spectrial.engines.sglang import SGLangConfig
from spectrial.engines.vllm import VLLMConfig
from spectrial.hosts.local import ProcInfo
from spectrial.hosts.memory import MemoryHost
from spectrial.params import TrialParams, load_params
from spectrial.readers.headline import headline
from spectrial.schema import Manifest, NcclEvidence, NcclProcess, NcclVariable, StartRecord
from spectrial.servers.envcheck import check_env, require_verified, strict_names, value_hash, verified

REPO = Path(__file__).resolve().parents[2]
TAG = "SPECTRIAL_TAG"
WANT = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "PYTHONPATH": "/p"}


def procs(blind: bool = True) -> list[ProcInfo]:
    """A launcher whose /proc is readable, and a renamed worker whose /proc setproctitle blanked."""
    launcher = ProcInfo(pid=10, ppid=1, pgid=10, cmdline=["python3", "-m", "sglang.launch_server"],
                        environ={TAG: "t", **WANT})
    worker = ProcInfo(pid=11, ppid=10, pgid=10, cmdline=["sglang::scheduler_TP0", "", ""],
                      environ={"LANG": "C"} if blind else {TAG: "t", **WANT})
    return [launcher, worker]


def test_only_nccl_variables_of_a_multi_gpu_launch_are_strict():
    assert strict_names(WANT, ranks=1) == [] and strict_names(WANT, ranks=1, nodes=1) == []
    assert strict_names(WANT, ranks=2) == ["NCCL_PROTO", "NCCL_ALGO"] == strict_names(WANT, ranks=1, nodes=2)


def test_an_unverifiable_worker_fails_only_where_it_matters():
    chk = check_env(procs(), WANT, TAG)
    assert chk.ok is True and chk.unverified  # one GPU: listed, not failed (as before)
    strict = require_verified(chk, strict_names(WANT, ranks=2), "a multi-GPU launch (2 rank(s)) with NCCL_* variables")
    assert strict.ok is False and not strict.unverified
    assert strict.problems == ["NCCL_PROTO, NCCL_ALGO not verifiable in 1 of 2 server processes: pid 11 "
                               "sglang::scheduler_TP0 (blanked environment, no probe record); a multi-GPU launch "
                               "(2 rank(s)) with NCCL_* variables needs them verified in every server process"]
    assert strict.summary == strict.problems[0] and chk.ok is True  # the check given is left as it was
    seen = check_env(procs(blind=False), WANT, TAG)
    assert require_verified(seen, ["NCCL_PROTO", "NCCL_ALGO"], "x") is seen
    # the probe's record of the renamed worker verifies it: nothing left to fail
    from spectrial.servers.envcheck import ProbeRecord

    probe = {11: ProbeRecord(pid=11, vars={k: value_hash("t", v) for k, v in WANT.items()})}
    probed = check_env(procs(), WANT, TAG, launched={TAG: "t", **WANT}, probes=probe)
    assert probed.ok and require_verified(probed, ["NCCL_PROTO"], "x") is probed


def test_nccl_evidence_fails_a_multi_gpu_launch_by_default():
    def engine(name: str, **config: object) -> object:
        p = load_params(data={"model": "/m", "engine": name, "env": {"NCCL_PROTO": "LL"}, "engine_config": config})
        return get_engine(name, p, MemoryHost())

    assert engine("sglang", tp_size=2).nccl_evidence_check({"NCCL_PROTO": "LL"}) == "fail"
    assert engine("sglang", tp_size=2).nccl_evidence_check({"CUDA_VISIBLE_DEVICES": "0"}) == "warn"
    assert engine("sglang", tp_size=1).nccl_evidence_check({"NCCL_PROTO": "LL"}) == "warn"
    assert engine("sglang", tp_size=2, nccl_evidence_check="warn").nccl_evidence_check({"NCCL_PROTO": "LL"}) == "warn"
    assert engine("vllm", tensor_parallel_size=2).nccl_evidence_check({"NCCL_ALGO": "Ring"}) == "fail"
    assert engine("sglang", tp_size=1, nccl_evidence_check="fail").nccl_evidence_check({}) == "fail"


def test_the_headline_says_what_was_verified():
    chk = check_env(procs(blind=False), WANT, TAG)
    ev = NcclEvidence(ok=True, processes=[NcclProcess(pid=11), NcclProcess(pid=12)],
                      variables={"NCCL_PROTO": NcclVariable(requested="LL", confirmed=[11, 12]),
                                 "NCCL_ALGO": NcclVariable(requested="Ring", confirmed=[11])})
    starts = [StartRecord(arm="baseline", env_check=chk, nccl_evidence=ev),
              StartRecord(arm="eagle3", env_check=chk)]
    v = verified(starts)
    assert v.line == ("environment verified: NCCL_* 2 of 2, other variables 1 of 1 in 4 server processes (2 starts; "
                      "by /proc); NCCL's own log: all requested NCCL_* in 1 of 2 rank(s)")
    bad = require_verified(check_env(procs(), WANT, TAG), ["NCCL_PROTO", "NCCL_ALGO"], "x")
    line = verified([StartRecord(arm="baseline", env_check=bad)]).line or ""
    assert line.startswith("environment NOT verified: NCCL_* 0 of 2, other variables 0 of 1 in 2 server processes")
    assert "NCCL_PROTO, NCCL_ALGO, PYTHONPATH unverifiable in 1 process" in line and "failed in 1 of 1 start" in line
    assert verified([StartRecord(arm="baseline")]).line is None  # nothing requested, nothing to say
    m = Manifest(run_id="r", starts=starts)
    assert headline(m).environment == v.line and v.line in headline(m).text()


def test_the_readme_says_where_nccl_evidence_check_is_documented_and_it_is():
    readme = (REPO / "README.md").read_text()
    assert "`nccl_evidence_check: fail`" not in readme.replace("`engine_config.nccl_evidence_check: fail`", "")
    named = re.findall(r"`(\w+Config)`\s+in\s+`(lib/spectrial/engines/\w+\.py)`", readme)
    assert {c for c, _ in named} == {"SGLangConfig", "VLLMConfig"}
    for cls, path in named:
        assert f"class {cls}(" in (REPO / path).read_text()
    for cls in (SGLangConfig, VLLMConfig):
        field = cls.model_fields["nccl_evidence_check"]
        assert field.default is None and "default: fail on a multi-GPU launch" in (field.description or "")
    assert "`TrialParams` in `lib/spectrial/params.py`" in readme
    assert "multi-GPU launch" in (TrialParams.model_fields["env_check"].description or "")
