"""``spec/catalogue.md`` is what ``spec/catalogue.py`` (run by ``python tools/regenerate.py``) writes from
the registry today."""

import importlib.util
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("catalogue_under_test", ROOT / "spec" / "catalogue.py")
catalogue = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(catalogue)


def test_the_committed_catalogue_is_the_generated_one():
    committed = (ROOT / "spec" / "catalogue.md").read_text(encoding="utf-8")
    assert committed == catalogue.render(), "spec/catalogue.md is stale: run python tools/regenerate.py"


def test_check_fails_on_a_stale_file_and_passes_on_a_fresh_one(tmp_path, monkeypatch):
    stale = tmp_path / "catalogue.md"
    stale.write_text(catalogue.render().replace("`32`", "`64`"), encoding="utf-8")
    monkeypatch.setattr(catalogue, "OUT", str(stale))
    assert catalogue.main(["--check"]) == 1
    assert catalogue.main([]) == 0 and catalogue.main(["--check"]) == 0


def test_the_catalogue_states_known_defaults_and_config_names():
    text = catalogue.render()
    # T5 (Raffel et al. 2020, HF T5Config): 32 buckets, max distance 128, relative_attention_num_buckets
    assert ("| `t5` | `minipos.t5.T5Bias` | `num_buckets`: `32`<br>`max_distance`: `128`<br>`bidirectional`: `True` "
            "| `num_buckets`: relative_attention_num_buckets") in text
    # RoFormer's base 10000, HF's rope_theta
    assert "| `rope` | `minipos.rope_scaling.Rotary` | `base`: `10000.0`" in text and "`base`: rope_theta" in text
    for line in ("| `num_kv_heads` | `None` |", "| `sliding_window` | `None` |", "| `sinks` | `False` |",
                 "| `mem_len` | `None` |", "| `chunks` | `[T]` |", "| `kv_lora_rank` | (required) |"):
        assert line in text, line


def test_the_script_runs_from_the_repository_root():
    done = subprocess.run([sys.executable, "spec/catalogue.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
