"""Build the control-plane binaries from the Go module proxy and cache them outside the repo.

Called by `lorapool cluster build`, `scripts/build-control-plane` and `python -m
lorapool_dev.cluster.build`. Each binary lands in `$LORAPOOL_CACHE/bin/<name>-<version>/` (default
`~/.cache/lorapool`), built into a temporary directory and renamed into place, so a killed
build never leaves a half-written binary behind. An exclusive lock on
`$LORAPOOL_CACHE/bin/.build.lock` serialises concurrent callers: the second one waits, then
finds everything built. A warm run only stats files and never starts `go`.

Why wrapper modules: `k8s.io/kubernetes` requires its staging modules (`k8s.io/api`, ...) at
`v0.0.0`, resolved through `replace => ./staging/...` lines that only work inside its own
repository, and etcd's server module has replace lines too, so `go install pkg@version` refuses
both. A generated module (in `$LORAPOOL_CACHE/gomod/`) requires them and pins each staging
module to `v0.<minor>.<patch>`; the list is read from that version's own go.mod.

Measured on the 2-core development machine (Go 1.26.8, empty module and build caches, another
`pip install` competing for one core most of the time), in build order:

    etcd                       139 s   (downloads etcd's dependencies)
    kube-apiserver             525 s   (downloads k8s.io/kubernetes and most shared packages)
    kube-controller-manager    154 s
    kube-scheduler              11 s
    kubectl                     66 s
    kwok                       257 s   (its own k8s.io/* v0.36.1 dependencies)
    helm                       274 s
    kube-network-policies      552 s   (the node tier's NetworkPolicy enforcer; its own k8s.io/* v0.32.3; measured at load 7-10, ~206 s CPU)
    total (cold)              1426 s   (23 min 47 s wall)
    Go caches warm, empty $LORAPOOL_CACHE   107 s   (mostly linking)
    warm check (all cached)    0.3 s   (no `go` process)

Disk: 470 MB of binaries, 1.5 GB Go module cache, 4.2 GB Go build cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from lorapool.api.clock import rfc3339
from lorapool.cache import cache_root, exclusive
from lorapool_dev.cluster.versions import COMPONENTS, Component, bin_dir
from lorapool_dev.gotool import go_binary, go_env, go_output, run_go

STAMP = "BUILD.json"


def log(message: str) -> None:
    """Progress goes to stderr so that `build` can be used in pipelines printing paths."""
    print(f"[lorapool cluster build] {message}", file=sys.stderr, flush=True)


def is_built(component: Component, root: Path) -> bool:
    directory = bin_dir(component, root)
    exe = directory / component.name
    return (directory / STAMP).is_file() and exe.is_file() and os.access(exe, os.X_OK)


def missing(root: Path, names: Sequence[str] | None = None) -> list[Component]:
    wanted = [c for c in COMPONENTS if names is None or c.name in names]
    return [c for c in wanted if not is_built(c, root)]


def build_lock(root: Path) -> contextlib.AbstractContextManager[None]:
    """Two builds at once would only compete for 2 cores and RAM: the second waits."""
    return exclusive(
        root / "bin" / ".build.lock", lambda holder: log(f"Waiting for another build to finish holder={holder}")
    )


def staging_modules(go_mod: str) -> list[str]:
    """Staging modules a k8s.io/kubernetes go.mod requires: replaced into ./staging/ and
    required at v0.0.0. Pure; read from the version's own go.mod so the list never drifts."""
    replaced = set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", go_mod, re.M))
    required = set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s+v0\.0\.0\s*$", go_mod, re.M))
    return sorted(replaced & required)


def wrapper_name(component: Component) -> str:
    """One wrapper per module version: the four Kubernetes binaries share theirs."""
    return f"{component.module.replace('/', '_')}-{component.version}"


def wrapper_go_mod(component: Component, go_mod_of_module: str) -> str:
    """The go.mod of the generated wrapper module. Pure."""
    go_line = re.search(r"^go\s+(\S+)", go_mod_of_module, re.M)
    lines = [
        f"module lorapool.local/build/{wrapper_name(component)}",
        "",
        f"go {go_line.group(1) if go_line else '1.26.0'}",
        "",
        f"require {component.module} {component.version}",
    ]
    if component.module == "k8s.io/kubernetes":
        staging_version = "v0." + component.version.lstrip("v").split(".", 1)[1]
        lines += ["", "replace ("]
        lines += [f"\t{m} => {m} {staging_version}" for m in staging_modules(go_mod_of_module)]
        lines += [")"]
    return "\n".join(lines) + "\n"


def prepare_wrapper(component: Component, root: Path, env: dict[str, str]) -> Path:
    """Write the wrapper module into the cache (shared by the four Kubernetes binaries)."""
    directory = root / "gomod" / wrapper_name(component)
    directory.mkdir(parents=True, exist_ok=True)
    info = json.loads(
        go_output(["mod", "download", "-json", f"{component.module}@{component.version}"], directory, env)
    )
    go_mod = Path(info["GoMod"]).read_text()
    text = wrapper_go_mod(component, go_mod)
    target = directory / "go.mod"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
        (directory / "go.sum").unlink(missing_ok=True)
    return directory


def build_component(component: Component, root: Path) -> float:
    """Compile one binary into a temp dir next to its final place, then rename. Seconds."""
    env = go_env()
    final = bin_dir(component, root)
    final.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{component.key}-", dir=final.parent))
    try:
        ldflags = " ".join(("-s", "-w", *component.ldflags))
        jobs = str(os.cpu_count() or 2)
        exe = tmp / component.name
        if component.wrapper:
            cwd = prepare_wrapper(component, root, env)
            run_go(
                [
                    "build",
                    "-mod=mod",
                    "-trimpath",
                    "-p",
                    jobs,
                    f"-ldflags={ldflags}",
                    "-o",
                    str(exe),
                    component.package,
                ],
                cwd,
                env,
            )
        else:
            install_env = dict(env, GOBIN=str(tmp))
            run_go(
                ["install", "-trimpath", "-p", jobs, f"-ldflags={ldflags}", f"{component.package}@{component.version}"],
                tmp,
                install_env,
            )
        if not exe.is_file():
            raise SystemExit(f"go produced no {component.name} binary in {tmp}")
        seconds = time.monotonic() - started
        stamp = {
            "component": component.name,
            "version": component.version,
            "package": component.package,
            "go": go_output(["env", "GOVERSION"], tmp, env).strip(),
            "build_seconds": round(seconds, 1),
            "built_at": rfc3339(time.time()),
        }
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        tmp.chmod(0o755)
        if final.exists():  # a stale dir without a stamp: replace it
            shutil.rmtree(final)
        tmp.rename(final)
        return seconds
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def ensure_built(names: Sequence[str] | None = None, root: Path | None = None) -> dict[str, Path]:
    """Build whatever is missing (under the lock) and return name -> binary path."""
    root = root or cache_root()
    todo = missing(root, names)
    if todo:
        if go_binary() is None:
            raise SystemExit(
                f"go is not on PATH nor in /usr/local/go/bin; install Go >= 1.26 to build the control plane ({', '.join(c.key for c in todo)})"
            )
        with build_lock(root):
            todo = missing(root, names)  # another process may have built them meanwhile
            total = time.monotonic()
            for index, component in enumerate(todo, 1):
                log(f"Building {component.key} ({index}/{len(todo)}) package={component.package}")
                seconds = build_component(component, root)
                log(f"Built {component.key} seconds={seconds:.0f} path={bin_dir(component, root)}")
            if todo:
                log(f"Built {len(todo)} component(s) seconds={time.monotonic() - total:.0f}")
    wanted = [c for c in COMPONENTS if names is None or c.name in names]
    return {c.name: bin_dir(c, root) / c.name for c in wanted}


def describe(root: Path | None = None) -> list[dict[str, object]]:
    """One row per component for `lorapool cluster status`."""
    root = root or cache_root()
    rows: list[dict[str, object]] = []
    for c in COMPONENTS:
        stamp_path = bin_dir(c, root) / STAMP
        stamp = json.loads(stamp_path.read_text()) if is_built(c, root) else {}
        rows.append(
            {
                "name": c.name,
                "version": c.version,
                "built": bool(stamp),
                "build_seconds": stamp.get("build_seconds"),
                "path": str(bin_dir(c, root) / c.name),
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lorapool_dev.cluster.build", description=__doc__ and __doc__.splitlines()[0]
    )
    parser.add_argument("components", nargs="*", help="subset to build (default: all)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    paths = ensure_built(args.components or None)
    for path in paths.values():
        print(path)
    log(f"Checked {len(paths)} component(s) seconds={time.monotonic() - started:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
