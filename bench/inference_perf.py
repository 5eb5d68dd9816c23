"""inference-perf (kubernetes-sigs, PyPI) as the benchmark's second load generator (issue 47).

    python bench/run.py --loadgen inference-perf --only a-uniform-poisson \\
        --systems "envoy + lorapool picker,gie epp (lora-affinity)"

The field's load generator drives the same cells (fresh replicas, the same system in front) with
its own Poisson arrivals and its multi-adapter traffic split (``load.lora_traffic_split``: the
scenario's popularity as weights), so a result cannot be an artefact of bench/loadgen.py. It
needs Python >= 3.12 and pins its own transformers, so it lives in its own virtual environment
(``$LORAPOOL_CACHE/venvs/inference-perf-<version>``, made by ``ensure_venv`` with a 3.12+
interpreter found on PATH or under pyenv), never in the project's extras. Its tokenizer is written
locally (``ensure_tokenizer``: a word-level vocabulary of 4-letter words, so one of its tokens is
about one token of the simulator's 4-characters estimate); nothing comes from a model hub.

Time: inference-perf runs on wall clocks, so its rates are divided and its durations multiplied
by the scenario's time scale, and its times divided back. Its per-request report
(``per_request_lifecycle_metrics.json``) becomes our ``Outcome`` records, summarised by the same
``loadgen.summarize`` as our own runs (goodput within the SLO, failures as infinite TTFT); its
own report files stay in ``OUT/inference-perf/<scenario>/<system>/``.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.loadgen import Outcome, Workload, _popularity_weights, adapter_name

VERSION = "0.7.0"
PACKAGE = f"inference-perf=={VERSION}"
STAMP = "LORAPOOL-VENV.json"
TOKENIZER = "inference-perf-tokenizer-v1"
LETTERS = "etaoinsr"  # 8^4 = 4,096 four-letter words
NAME = "inference-perf"


def python_312() -> Path:
    """A Python >= 3.12 interpreter: python3.1x on PATH, else pyenv's newest; a clear error if none."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (12, 13, 14)]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(str(root / "versions" / "3.1[2-9]*" / "bin" / "python3")), reverse=True)
    for found in filter(None, candidates):
        probe = subprocess.run(
            [found, "-c", "import sys; print(sys.version_info >= (3, 12))"], capture_output=True, text=True, timeout=30
        )
        if probe.stdout.strip() == "True":
            return Path(found)
    raise RuntimeError(
        "inference-perf needs Python >= 3.12 and none was found (python3.12 on PATH or under ~/.pyenv/versions):"
        " install one, e.g. `pyenv install 3.12`"
    )


def venv_dir(root: Path | None = None) -> Path:
    from lorapool.cache import cache_root

    return (root or cache_root()) / "venvs" / f"inference-perf-{VERSION}"


def ensure_venv(root: Path | None = None) -> tuple[Path, float]:
    """The venv's ``inference-perf`` executable, made first when missing (under a lock, in place:
    a venv cannot be renamed; a directory without the stamp is a killed install, made again); the
    seconds it took (0 when cached)."""
    from lorapool.cache import exclusive

    target = venv_dir(root)
    exe = target / "bin" / "inference-perf"
    if (target / STAMP).is_file() and exe.is_file():
        return exe, 0.0
    started = time.monotonic()
    with exclusive(target.parent / ".inference-perf.lock", lambda holder: print(f"waiting for {holder}")):
        if not ((target / STAMP).is_file() and exe.is_file()):
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([str(python_312()), "-m", "venv", str(target)], check=True, timeout=300)
            pip = [str(target / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            subprocess.run([*pip, PACKAGE], check=True, timeout=1800)
            stamp = {"package": PACKAGE, "seconds": round(time.monotonic() - started, 1)}
            (target / STAMP).write_text(json.dumps(stamp) + "\n")
    return exe, time.monotonic() - started


# Runs inside the venv (its ``tokenizers``): a word-level tokenizer over 4-letter words, decoded
# with spaces, so a prompt of n tokens is about 5n characters (n to 1.25n of the simulator's tokens).
_TOKENIZER_SCRIPT = """
import itertools, json, sys
from pathlib import Path
from tokenizers import Tokenizer, models, pre_tokenizers
letters, out = sys.argv[1], Path(sys.argv[2])
words = ["".join(w) for w in itertools.product(letters, repeat=4)]
vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.add_special_tokens(["[UNK]", "</s>"])
tok.save(str(out / "tokenizer.json"))
config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "eos_token": "</s>",
          "model_max_length": 32768, "clean_up_tokenization_spaces": False}
(out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
"""


def ensure_tokenizer(venv: Path, root: Path | None = None) -> Path:
    """The local tokenizer's directory (written once with the venv's own ``tokenizers``)."""
    target = venv.parent / TOKENIZER if root is None else root / TOKENIZER
    if (target / "tokenizer.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-c", _TOKENIZER_SCRIPT, LETTERS, str(target)], check=True, timeout=120)
    return target


SPLIT_UNIT = 2**20  # splits are multiples of 2^-20: their float sum is exactly 1.0, which 0.7.0 checks with ==


def traffic_split(w: Workload) -> list[dict[str, Any]]:
    """The scenario's adapter popularity as inference-perf's ``lora_traffic_split``: dyadic shares
    (the rounding remainder on the most popular adapter) that sum to exactly 1.0. Pure."""
    weights = _popularity_weights(w)
    total = sum(weights)
    units = [max(1, round(SPLIT_UNIT * x / total)) for x in weights]
    units[0] += SPLIT_UNIT - sum(units)
    return [{"name": adapter_name(i), "split": u / SPLIT_UNIT} for i, u in enumerate(units)]


def _distribution(low: int, high: int) -> dict[str, Any]:
    """Uniform between the scenario's bounds, as bench/loadgen.py draws them."""
    return {"type": "uniform", "min": low, "max": high, "mean": (low + high) / 2, "std_dev": (high - low) / 4}


def check(w: Workload) -> None:
    """Refuse, with the fix, a workload inference-perf's Poisson stages cannot replay. Pure."""
    if w.arrival != "poisson" or w.flood or w.turns > 1:
        raise ValueError(
            f"inference-perf drives Poisson single-turn scenarios only (arrival={w.arrival!r}): choose a"
            " scenario such as a-uniform-poisson or b-zipf-poisson with --only"
        )


def config(
    w: Workload, *, url: str, model: str, tokenizer: Path, report_dir: Path, time_scale: float
) -> dict[str, Any]:
    """inference-perf's config for ``w`` against ``url``: Poisson at the scenario's rate and for its
    duration in wall time, streamed completions, its random data at the scenario's prompt and output
    lengths, every per-request record kept. Pure."""
    check(w)
    return {
        "load": {
            "type": "poisson",
            "stages": [{"rate": w.rate_rps / time_scale, "duration": w.duration_s * time_scale}],
            "base_seed": w.seed,
            "worker_max_concurrency": 1000,  # its default (100 per worker) would cap a slow system's in-flight requests
            "lora_traffic_split": traffic_split(w),
        },
        "api": {"type": "completion", "streaming": True},
        "server": {"type": "vllm", "model_name": model, "base_url": url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(tokenizer)},
        "data": {
            "type": "random",
            "input_distribution": _distribution(*w.prompt_tokens),
            "output_distribution": _distribution(*w.output_tokens),
        },
        "report": {
            "request_lifecycle": {"summary": True, "per_stage": False, "per_request": True, "per_adapter": True}
        },
        "storage": {"local_storage": {"path": str(report_dir)}},
    }


def outcomes(records: list[dict[str, Any]], time_scale: float) -> list[Outcome]:
    """inference-perf's per-request records as our Outcomes, in simulated seconds from the first send. Pure."""
    if not records:
        return []
    t0 = min(float(r["start_time"]) for r in records)
    out = []
    for r in records:
        error, info = r.get("error"), r.get("info") or {}
        response = info.get("response_metrics") or {}
        o = Outcome(model=str(info.get("lora_adapter") or ""), sent_s=(float(r["start_time"]) - t0) / time_scale)
        o.status = 0 if error else 200
        o.error = f"{error.get('error_type', '')}: {error.get('error_msg', '')}"[:200] if error else ""
        times = response.get("output_token_times") or response.get("chunk_times") or []
        if not error:
            o.done_s = (float(r["end_time"]) - t0) / time_scale
            o.ttft_s = (float(times[0]) - float(r["start_time"])) / time_scale if times else None
            o.tokens = int(response.get("output_tokens") or len(times))
        out.append(o)
    return out


def run_cell(w: Workload, *, url: str, model: str, report_dir: Path, time_scale: float) -> list[Outcome]:
    """Run inference-perf once against ``url``; its report files in ``report_dir``; its requests as Outcomes."""
    exe, _ = ensure_venv()
    tokenizer = ensure_tokenizer(exe.parent.parent)
    shutil.rmtree(report_dir, ignore_errors=True)
    report_dir.mkdir(parents=True)
    cfg = config(w, url=url, model=model, tokenizer=tokenizer, report_dir=report_dir, time_scale=time_scale)
    path = report_dir / "lorapool-config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    timeout = w.duration_s * time_scale + 600
    with (report_dir / "inference-perf.log").open("w") as log:
        done = subprocess.run([str(exe), "--config_file", str(path)], stdout=log, stderr=subprocess.STDOUT, env=env,
                              cwd=report_dir, timeout=timeout, check=False)  # fmt: skip
    found = sorted(report_dir.rglob("per_request_lifecycle_metrics.json"))
    if done.returncode != 0 or not found:
        tail = (report_dir / "inference-perf.log").read_text()[-1500:]
        raise RuntimeError(f"inference-perf exited {done.returncode} without a per-request report:\n{tail}")
    return outcomes(json.loads(found[-1].read_text()), time_scale)


def within(outs: list[Outcome], warmup_s: float) -> list[Outcome]:
    """The requests sent after the warm-up (simulated seconds), as our own runs count them. Pure."""
    return [o for o in outs if o.sent_s >= warmup_s and not math.isnan(o.sent_s)]


if __name__ == "__main__":  # python -m bench.inference_perf: make the venv and the tokenizer, say where
    exe, seconds = ensure_venv()
    print(exe, ensure_tokenizer(exe.parent.parent), f"{seconds:.0f} s", file=sys.stderr)
