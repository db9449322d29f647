"""slurm/selfplay.sh passes its signal's lead to the ranks (`SELFPLAY_SIGNAL_LEAD`, from `SIGNAL_LEAD`), which must
be the lead its `#SBATCH --signal` line asks SLURM for; no cluster needed (test_selfplay_sh.py runs the script)."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_the_lead_the_ranks_are_told_is_the_one_sbatch_asks_for():
    script = (REPO / "slurm" / "selfplay.sh").read_text()
    asked = re.findall(r"^#SBATCH --signal=B:USR1@(\d+)\s*$", script, re.M)
    told = re.findall(r"^SIGNAL_LEAD=(\d+)\b", script, re.M)
    assert len(asked) == 1 and told == asked, (asked, told)
    assert re.search(r"^export SELFPLAY_SIGNAL_LEAD=\$\{SELFPLAY_SIGNAL_LEAD:-\$SIGNAL_LEAD\}", script, re.M)
