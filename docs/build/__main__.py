"""``python -m docs.build``: build the site with mkdocs or Zensical and run the build steps on it.

    python -m docs.build                  mkdocs (the default): python -m mkdocs build --strict, whose
                                          hook runs the steps
    python -m docs.build zensical         python -m zensical build --strict --clean, then the steps
    python -m docs.build fonts            remake the offline font subsets from the built site/

Run from the repository root, like ``python -m mkdocs build``: the pages' code blocks import
``minipos``, ``proofs`` and ``docs.hooks.evidence`` from there. ``-f`` names another config file.
Exit status 0 when the site is built and passes every check; the generator's own status when it
fails; 1 with one line per problem when a check fails.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

from minipos.terminal import plain

from . import BuildError, finish, fonts


class _Loader(yaml.SafeLoader):
    """YAML of mkdocs.yml: tags such as ``!!python/name:`` read as None (only ``site_dir`` is used)."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


def site_dir(config: Path) -> Path:
    """The ``site_dir`` of ``config`` (default ``site``), relative to the config file's folder."""
    data = yaml.load(config.read_text(encoding="utf-8"), Loader=_Loader) or {}
    return (config.parent / data.get("site_dir", "site")).resolve()


def build(generator: str, config: Path) -> int:
    """Run ``generator`` on ``config``; for Zensical, which ignores ``hooks:``, then ``finish``."""
    env = dict(os.environ, MPLBACKEND="Agg", NO_MKDOCS_2_WARNING="1", MINIPOS_DOCS_GENERATOR=generator)
    command = [sys.executable, "-m", generator, "build", "--strict", "-f", str(config)]
    if generator == "zensical":
        command.append("--clean")      # the pages' code runs again: a cached page could hide a failure
    status = subprocess.run(command, env=env).returncode
    if status or generator == "mkdocs":
        return status
    finish(site_dir(config))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m docs.build", description=plain(__doc__.splitlines()[0]))
    p.add_argument("what", nargs="?", default="mkdocs", choices=["mkdocs", "zensical", "fonts"],
                   help="the generator to build with (default mkdocs), or fonts: remake the font subsets")
    p.add_argument("-f", "--config-file", type=Path, default=Path("mkdocs.yml"), metavar="CONFIG",
                   help="the config file (default mkdocs.yml)")
    args = p.parse_args(argv)
    if not args.config_file.is_file():
        p.error(f"--config-file {args.config_file}: no such file")
    if args.what == "zensical" and subprocess.run([sys.executable, "-c", "import zensical"],
                                                  capture_output=True).returncode:
        p.error("zensical is not installed: python -m pip install zensical")
    try:
        if args.what == "fonts":
            site = site_dir(args.config_file)
            if not (site / "index.html").is_file():
                p.error(f"no built site in {site}: build it first (python -m docs.build)")
            print("\n".join(fonts.rebuild(site)))
            return 0
        return build(args.what, args.config_file)
    except (BuildError, OSError) as error:
        print(f"python -m docs.build: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
