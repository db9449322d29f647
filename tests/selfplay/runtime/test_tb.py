"""TensorBoard logging writes real event files that TensorBoard's own reader understands."""

import math

from selfplay.runtime.tb import TBLogger, read_scalars


def test_scalars_text_and_rank_gating(tmp_path):
    log = TBLogger(tmp_path)
    for step in range(3):
        log.scalars({"solver/pass_rate": 0.1 * step, "ppo/solver/kl": float("nan")}, step)
    log.text("samples/solver", "```python\ndef f(x):\n    return x\n```", 0)
    log.hparams({"ppo.clip": 0.2, "run.seed": 0})
    log.close()
    scalars = read_scalars(tmp_path)
    assert [round(v, 6) for _, v in scalars["solver/pass_rate"]] == [0.0, 0.1, 0.2]
    assert "ppo/solver/kl" not in scalars  # non-finite values are skipped

    silent = TBLogger(tmp_path / "rank1", enabled=False)
    silent.scalars({"solver/pass_rate": 1.0}, 0)
    silent.close()
    assert not (tmp_path / "rank1").exists()
    assert math.isfinite(scalars["solver/pass_rate"][-1][1])
