"""`selfplay warmstart [CONFIG] [key=value ...]`: build and behaviour-clone both agents; writes step_0 and
evaluates it (a step_0 left without its evaluation, by a kill, is evaluated now)."""

from __future__ import annotations

from selfplay.cli.train import configure, train_args  # same arguments as train

__all__ = ["configure", "run"]


def run(args) -> int:
    from selfplay.eval.evaluate import BREAKDOWNS
    from selfplay.runtime.config import load_config
    from selfplay.train.evaluation import EvaluationStopped
    from selfplay.train.loop import SelfPlay

    config, overrides = train_args(args)
    cfg = load_config(config, overrides)
    loop = SelfPlay(cfg)
    try:
        latest = loop.ckpt.latest_checkpoint()
        if latest is not None and (latest.name != "step_0" or "eval_before" in loop.ckpt.load_state(latest)):
            print(f"{cfg.run.dir} already holds a checkpoint ({loop.ckpt.latest_checkpoint().name}); nothing to do")
            return 0
        loop.stop.install()  # SIGTERM / SIGUSR1 / the stop file: answered between the evaluation's pieces
        try:
            loop.setup()
        except EvaluationStopped:  # step_0 stands as written; the next start evaluates it
            print(f"stopped within step 0's evaluation; {cfg.run.dir}'s step_0 is evaluated when the run starts again")
            return 0
        before = loop.evals.get("0", {})
        for split, res in before.items():
            if split not in BREAKDOWNS:
                print(f"  held-out {split:<22} greedy pass@1 {res.get('pass@1_greedy', float('nan')):.3f}")
    finally:
        loop.close()
    return 0
