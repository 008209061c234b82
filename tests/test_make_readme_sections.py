"""A folder's README is shared by the scripts that make its files: regenerating one section keeps the others
(the tiny MoE's trace script used to rewrite data/traces/README.md whole, dropping 06's capture and the notes)."""

from __future__ import annotations

from moelab.datasets import repo_root
from moelab.make import write_readme_section


def test_a_section_is_replaced_in_place_and_the_others_stay(tmp_path):
    readme = tmp_path / "README.md"
    write_readme_section(readme, "a", "first A\n")
    readme.write_text(readme.read_text() + "\n## notes by hand\nkept\n")
    write_readme_section(readme, "b", "first B")
    write_readme_section(readme, "a", "second A")
    text = readme.read_text()
    assert text.startswith("# Bundled expert traces\n")
    assert "second A" in text and "first A" not in text and "first B" in text and "## notes by hand\nkept" in text
    assert text.index("second A") < text.index("notes by hand") < text.index("first B")  # replaced where it was
    assert text.count("<!-- a: begin -->") == text.count("<!-- a: end -->") == 1


def test_the_bundled_traces_readme_marks_each_generated_section():
    text = (repo_root() / "data" / "traces" / "README.md").read_text(encoding="utf-8")
    for name in ("tiny-moe-trace", "deployment-trace"):  # moelab.make.tiny_moe_trace, moelab.make.deployment_trace
        assert text.count(f"<!-- {name}: begin -->") == 1 and text.count(f"<!-- {name}: end -->") == 1
    assert "## sharegpt-moe" in text  # the hand-written section outside both
