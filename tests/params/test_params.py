"""Parameter validation: every bad input names the field and the fix; overrides behave like papermill's -p."""

from __future__ import annotations

import pytest

from spectrial.errors import ConfigError
from spectrial.params import apply_override, load_params, parse_overrides

BASE = {"model": "tiny:target"}


def test_defaults_and_override_types(write_params):
    p = load_params(write_params(BASE), parse_overrides(["steps=4", "repeats=5", "env.NCCL_PROTO=LL",
                                                         "engine_config.threads=1", "arms.1.synthetic_accept=0.7"]))
    assert p.steps == 4 and p.repeats == 5
    assert p.env == {"NCCL_PROTO": "LL"}
    assert p.engine_config == {"threads": 1}
    assert p.arms[1].synthetic_accept == 0.7
    assert p.arm_steps(p.arms[1]) == 4


def test_env_override_stays_a_string(write_params):
    p = load_params(write_params(BASE), parse_overrides(["env.NCCL_BUFFSIZE=16777216"]))
    assert p.env["NCCL_BUFFSIZE"] == "16777216"


def test_unknown_field_is_named_with_allowed_values(write_params):
    with pytest.raises(ConfigError) as e:
        load_params(write_params({**BASE, "stepz": 2}))
    msg = str(e.value)
    assert "stepz" in msg and "unknown parameter" in msg and "steps" in msg


def test_unknown_arm_field_lists_arm_fields(write_params):
    with pytest.raises(ConfigError) as e:
        load_params(write_params({**BASE, "arms": [{"name": "b", "methd": "none"}]}))
    assert "arms.0.methd" in str(e.value) and "method" in str(e.value)


def test_steps_below_one_is_refused(write_params):
    with pytest.raises(ConfigError) as e:
        load_params(write_params(BASE), {"steps": 0})
    assert "steps" in str(e.value) and "greater than or equal to 1" in str(e.value)


def test_wrong_engine_names_allowed_values(write_params):
    with pytest.raises(ConfigError) as e:
        load_params(write_params({**BASE, "engine": "tgi"}))
    msg = str(e.value)
    assert "engine" in msg and "'llamacpp'" in msg and "'tgi'" in msg


def test_synthetic_rates_validated(write_params):
    with pytest.raises(ConfigError, match="outside"):
        load_params(write_params({**BASE, "arms": [{"name": "e", "method": "eagle3", "synthetic_accept": 1.5}]}))
    with pytest.raises(ConfigError, match="non-increasing"):
        load_params(write_params({**BASE, "arms": [{"name": "e", "method": "eagle3",
                                                    "synthetic_accept": [0.5, 0.9]}]}))


def test_duplicate_arm_names(write_params):
    with pytest.raises(ConfigError, match="unique"):
        load_params(write_params({**BASE, "arms": [{"name": "a"}, {"name": "a"}]}))


def test_missing_params_file_says_where_it_looked():
    with pytest.raises(ConfigError, match="not found"):
        load_params("params/does-not-exist.yaml")


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        parse_overrides(["steps"])
    with pytest.raises(ConfigError, match="not an index"):
        apply_override({"arms": []}, "arms.3.name", "x")


def test_bad_env_name_is_refused():
    from spectrial.hosts.local import env_prefix

    with pytest.raises(ConfigError, match="not a valid environment variable name"):
        env_prefix({"BAD;NAME": "1"})


def test_repo_params_files_validate():
    p = load_params("params/local.yaml")
    assert p.engine == "llamacpp" and [a.method for a in p.arms] == ["none", "draft", "eagle3"]


def test_workload_identity_decides_what_is_comparable():
    """Drift and diff compare runs only on the same workload: an old record's `prompts` reads as today's default
    workload; another dataset, request format, sampling or seed is another workload."""
    from spectrial.params import workload_identity

    old = {"prompts": "bundled", "max_tokens": 64}  # a record from before workloads
    new = load_params(data={"model": "m"}).model_dump(mode="json")
    assert workload_identity(old) == workload_identity(new)
    for change in ({"workload": "sharegpt"}, {"request_format": "chat"}, {"sampling": {"temperature": 0.7}},
                   {"seed": 1}, {"output_len": "dataset"}, {"max_tokens": 32}):
        assert workload_identity({**new, **change}) != workload_identity(new), change


def test_bind_is_an_address_or_a_host_name(write_params):
    for ok in ("127.0.0.1", "0.0.0.0", "::1", "gpu-box.local"):
        assert load_params(write_params({**BASE, "bind": ok})).bind == ok
    for bad in ("127.0.0.1; rm -rf /", "a b", "-x"):
        with pytest.raises(ConfigError, match=r"bind: .*neither an IP address nor a host name"):
            load_params(write_params({**BASE, "bind": bad}))
