"""README's configuration table is the one generated from the Settings class."""

from dataclasses import fields
from pathlib import Path

from orchestra.settings import (
    SETTING_DOCS,
    Settings,
    markdown_table,
    readme_with_table,
    undocumented_settings,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_setting_has_a_doc():
    assert undocumented_settings() == [], "add an entry to SETTING_DOCS in orchestra/settings.py"
    assert set(SETTING_DOCS) <= {f.name for f in fields(Settings)}, "SETTING_DOCS names a setting that is gone"


def test_readme_table_is_the_generated_one():
    readme = README.read_text(encoding="utf-8")
    assert readme_with_table(readme) == readme, "run: python -m orchestra.settings --write-readme"


def test_the_table_has_one_row_per_setting_with_its_variable_and_default():
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(fields(Settings))
    assert rows[0].startswith("| `ORCHESTRA_HOME` (`--home`) | `~/.orchestra` |")
    assert "| `ORCHESTRA_LLM_TIMEOUT` | `60` |" in markdown_table()
    assert "| `ORCHESTRA_ACCESS_LOG` (`--access-log/--no-access-log`) | `false` |" in markdown_table()


def test_a_bad_number_names_the_variable_in_plain_words():
    import pytest

    with pytest.raises(ValueError, match=r"ORCHESTRA_PORT must be an integer, got 'eighty'"):
        Settings.from_env(env={"ORCHESTRA_PORT": "eighty"})
    with pytest.raises(ValueError, match=r"ORCHESTRA_LLM_TIMEOUT must be a number, got 'soon'"):
        Settings.from_env(env={"ORCHESTRA_LLM_TIMEOUT": "soon"})


async def test_the_sqlite_busy_timeout_is_the_setting_in_seconds(tmp_path):
    """ORCHESTRA_DB_BUSY_TIMEOUT (seconds) is what a SQLite store's connections wait on a
    lock (PRAGMA busy_timeout, milliseconds); 10 s unless set; out of range is refused."""
    import pytest

    from orchestra.core import Core
    from tests.conftest import make_settings

    assert Settings.from_env(env={}).db_busy_timeout == 10.0
    for bad in ("0", "-1", "3601"):
        with pytest.raises(ValueError, match="ORCHESTRA_DB_BUSY_TIMEOUT must be above 0"):
            Settings.from_env(env={"ORCHESTRA_DB_BUSY_TIMEOUT": bad})
    for value, expected in ((None, 10000), (0.25, 250)):
        extra = {} if value is None else {"db_busy_timeout": value}
        home = tmp_path / f"home-{expected}"
        core = await Core.open(make_settings(home, f"sqlite:///{home / 'orchestra.db'}", **extra))
        try:
            assert (await core.db.aexecute_sql("PRAGMA busy_timeout")).fetchall() == [(expected,)]
        finally:
            await core.close()
