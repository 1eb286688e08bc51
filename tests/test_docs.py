"""The README and docs/ stay true: links resolve, the `earl` commands they show parse, the README
stays a front page (<= 12 KB), and docs/configuration.md lists every config key.

    python -m pytest tests/test_docs.py
    python tests/test_docs.py --write   # regenerate docs/configuration.md's key tables
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import shlex
import sys
import typing
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CONFIG_PAGE = ROOT / "docs" / "configuration.md"
README_MAX_BYTES = 12 * 1024
# keys whose field carries no comment in the schema
UNCOMMENTED = {
    "policy.compare": "the selector/dispatcher pairs `earl simulate --compare` runs",
    "plan.rollout": "initial rollout plan (`tp2-dp1`); empty: tp1-dpN for N processes",
    "plan.experience": "initial log-prob plan; empty: the training plan",
    "plan.train": "initial training plan (`tp1-dp2-zero`); empty: tp1-dpN, `zero` on FSDP2 when N > 1",
}
BEGIN, END = "<!-- keys:{} begin (python tests/test_docs.py --write) -->", "<!-- keys:{} end -->"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(_anchor(line.lstrip("#")))
    return out


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_relative_links_resolve(page):
    bad = []
    for link in _links(page):
        if re.match(r"[a-z]+://|mailto:", link):
            continue
        target, _, anchor = link.partition("#")
        dest = (page.parent / target).resolve() if target else page
        if not dest.exists():
            bad.append(f"{link} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{link} (no heading #{anchor} in {dest.name})")
    assert not bad, f"{page.name}: broken links: {bad}"


def _commands(path: Path) -> list[list[str]]:
    """Each `earl ...` command line shown in a fenced bash block or an inline `earl ...` span."""
    text = path.read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`(earl [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    out = []
    for line in lines:
        for part in re.split(r"&&|\|\||;", line.split("  #")[0].split(" # ")[0]):
            words = shlex.split(part.strip(), comments=True) if part.strip() else []
            if words and words[0] == "earl":
                out.append(words)
    return out


@functools.cache
def _cli():
    from earl.cli import app

    return typer.main.get_command(app)


def _check_command(words: list[str]) -> str | None:
    """None when `words` names an existing subcommand and only its options; else why not."""
    group = _cli()
    if len(words) == 1 or words[1].startswith("--"):
        known = {o for p in group.params for o in p.opts}
        extra = [w for w in words[1:] if w.startswith("--") and w.split("=")[0] not in known]
        return f"unknown options {extra}" if extra else None
    cmd = group.commands.get(words[1])
    if cmd is None:
        return f"no subcommand {words[1]!r} (valid: {', '.join(sorted(group.commands))})"
    known = {o for p in cmd.params for o in p.opts} | {"--help"}
    extra = [w for w in words[2:] if w.startswith("--") and w.split("=")[0] not in known]
    return f"unknown options {extra} for earl {words[1]}" if extra else None


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_earl_commands_parse(page):
    bad = [f"{' '.join(w)}: {why}" for w in _commands(page) if (why := _check_command(w))]
    assert not bad, f"{page.name}: " + "; ".join(bad)


def test_readme_commands_found():
    """The README shows the three jobs and the quick start; the parser above saw them."""
    subcommands = {w[1] for w in _commands(README) if len(w) > 1}
    assert {"simulate", "run", "estimate"} <= subcommands


def test_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail to docs/"


def test_readme_names_the_ci_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    text = README.read_text()
    assert "python -m pytest\n" in ci and "python -m pytest" in text
    assert ".ci/run" in text and ".ci/lock" in text


def test_readme_file_tree_names_existing_files():
    """Every `name.py` / `name.sh` in the README's file tree is a file of the repository (a
    rename elsewhere must update the tree)."""
    tree = README.read_text().split("<!-- file-tree begin")[1].split("<!-- file-tree end")[0]
    have = {p.name for d in ("earl", "studies", "benchmarks") for p in (ROOT / d).rglob("*") if p.is_file()}
    names = set(re.findall(r"[\w*]+\.(?:py|sh)\b", tree))
    missing = sorted(n for n in names if not any(Path(h).match(n) for h in have))
    assert names and not missing, f"README.md's file tree names files that do not exist: {missing}"


# ---- docs/configuration.md: every key of the run config and the scenario ---------------------
def _field_notes(cls: type) -> dict[str, str]:
    """field name -> its comment in the class source (trailing, or the comment lines above)."""
    notes, above, last = {}, [], None
    for line in inspect.getsource(cls).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#  ") and last:  # an indented comment continues the field above
            notes[last] += " " + stripped.lstrip("# ")
            continue
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        m = re.match(r"(\w+): [^=]+(?:=\s*(.*?))?(?:\s+#\s*(.*))?$", stripped)
        last = None
        if m and not stripped.startswith(("def ", "return", "raise", "if ", "for ")):
            last = m.group(1)
            notes[last] = " ".join(above + ([m.group(3)] if m.group(3) else []))
        above = []
    return notes


def _key_rows(cls: type, rename: dict[str, str]) -> list[tuple[str, str, str, str]]:
    from earl.config_machinery import type_name

    rows = []

    def walk(c: type, path: tuple[str, ...], obj) -> None:
        hints, notes = typing.get_type_hints(c), _field_notes(c)
        for f in dataclasses.fields(c):
            if not f.init:
                continue
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], path + (f.name,), value)
                continue
            key = ".".join(path + (f.name,))
            shown = (",".join(map(str, value)) or "()") if isinstance(value, tuple) else value
            rows.append((rename.get(key, key), type_name(hints[f.name]), f"`{shown!s}`" if shown != "" else '`""`',
                         notes.get(f.name, "").replace("|", "\\|")))

    walk(cls, (), cls())
    return [(k, t, d, n or UNCOMMENTED.get(k, "")) for k, t, d, n in rows]


def _tables() -> dict[str, str]:
    from earl.runtime.run_config import RunConfig
    from earl.sim.scenario import KEY_NAMES, Scenario

    out = {}
    for name, cls, rename in (("run", RunConfig, {}), ("scenario", Scenario, KEY_NAMES)):
        lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
        lines += [f"| `{k}` | {t} | {d} | {n} |" for k, t, d, n in sorted(_key_rows(cls, rename))]
        out[name] = "\n".join(lines)
    return out


def _write_tables() -> None:
    text = CONFIG_PAGE.read_text()
    for name, table in _tables().items():
        begin, end = BEGIN.format(name), END.format(name)
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), f"{begin}\n{table}\n{end}", text, flags=re.S)
    CONFIG_PAGE.write_text(text)


def test_configuration_page_lists_every_key():
    from earl import config_machinery as config
    from earl.runtime.run_config import RunConfig
    from earl.sim.scenario import KEYS

    text = CONFIG_PAGE.read_text()
    missing = [k for k in [*config.keys_of(RunConfig), *KEYS] if f"| `{k}` |" not in text]
    assert not missing, f"docs/configuration.md lacks keys {missing}: run python tests/test_docs.py --write"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        _write_tables()
    else:
        sys.exit("usage: python tests/test_docs.py --write")
