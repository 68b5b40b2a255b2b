"""The docs stay true to the code: the generated flag reference, the front page's size and links.

`mkdocs build --strict` (scripts/test.sh runs it before pytest) checks that every
page is in the nav and every link and anchor resolves; these tests check what
it cannot: that docs/reference/cli.md is what the parsers say now.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

from beam_pipeline import cli

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", REPO / "scripts" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_cli_reference_is_what_the_parsers_say_now():
    committed = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert committed == _generator().render(), "docs/reference/cli.md is stale: run scripts/gen_cli_reference.py"


def test_cli_reference_follows_a_changed_help_text(monkeypatch):
    """A flag added to (or a help text changed in) the parser shows up in the generated page."""
    real = cli._convert_parser

    def changed() -> argparse.ArgumentParser:
        p = real()
        p.add_argument("--brand-new-flag", metavar="X", help="a help text nobody wrote before | with a bar")
        return p

    monkeypatch.setattr(cli, "_convert_parser", changed)
    text = _generator().render()
    assert "| `--brand-new-flag` | `X` | a help text nobody wrote before \\| with a bar |" in text
    for action in real()._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}`" in text


def test_readme_is_a_front_page_linking_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = set(re.findall(r"\]\(docs/([^)#]+\.md)", readme))
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert pages - linked == set(), "pages the README's 'where to go next' does not link"


def test_every_docs_page_is_in_the_nav():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]

    def leaves(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from leaves(value)
            else:
                yield value

    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert set(leaves(nav)) == pages | {"index.md"}


def test_detection_docs_name_every_background_spelling_the_code_takes():
    """labelme's `_background_` was taken as the background, but the docs named only `background`,
    `__background__` and `Background`."""
    from beam_pipeline.annotations.objects import fixed_object_labels, is_background

    text = (REPO / "docs" / "detection.md").read_text()
    for name in ("background", "Background", "__background__", "_background_", "BACKGROUND"):
        assert is_background(name) and f"`{name}`" in text, name
        assert fixed_object_labels([name, "cat"]) == ("background", "cat")
    assert "`background` in any letter case with any underscores around it" in " ".join(text.split())
    for other in ("backgrounds", "back_ground", "-background-", " background"):
        assert not is_background(other), other


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bad_input_reasons_table_is_the_code_table():
    page = (REPO / "docs" / "bad-input.md").read_text()
    assert page == _load_script("gen_docs_tables").render(page), (
        "docs/bad-input.md's reasons table is stale: run scripts/gen_docs_tables.py"
    )


def test_reasons_table_follows_a_new_reason(monkeypatch):
    """A reason added to the code's table shows up on the page."""
    from beam_pipeline.vocab import reasons

    added = reasons.Reason("brand_new_reason", "a meaning nobody wrote before", (reasons.CHECK,))
    monkeypatch.setattr(reasons, "GENERAL", (*reasons.GENERAL, added))
    monkeypatch.setattr(reasons.markdown_table, "__defaults__", (reasons.GENERAL,))
    page = _load_script("gen_docs_tables").render((REPO / "docs" / "bad-input.md").read_text())
    assert "| `brand_new_reason` | check | a meaning nobody wrote before |" in page


def test_every_reason_a_page_names_is_in_the_code_table_and_every_code_is_emitted():
    """The reason tables of the detection page name codes the code has; each code of the table is emitted
    somewhere outside vocab/, and each reason constant is a row of the table."""
    from beam_pipeline.vocab import reasons

    codes = {r.code for r in reasons.REASONS}
    named = set()
    for page in ("detection.md", "bad-input.md"):
        text = (REPO / "docs" / page).read_text()
        for table in re.findall(r"^\| reason \|[^\n]*\n\|[-| ]+\|\n((?:\|[^\n]*\n)+)", text, re.M):
            named |= set(re.findall(r"^\| `([a-z_]+)`", table, re.M))
    assert named - codes == set()
    assert len(named) > 30
    constants = {v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str) and v.islower()}
    constants -= {*reasons.STAGES, reasons.IMAGE, reasons.OBJECT}
    assert constants == codes
    assert len({(r.code, r.file) for r in reasons.REASONS}) == len(reasons.REASONS)
    source = "\n".join(p.read_text() for p in (REPO / "beam_pipeline").rglob("*.py") if p.parent.name != "vocab")
    names = {v: k for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str)}
    assert [c for c in sorted(codes) if not re.search(rf"\b{names[c]}\b", source)] == []
