"""With no logging configured, blok's warnings on stderr say which run and step wrote them
(Python's own last resort printed the message alone), and say nothing more once the
application configures logging. In a fresh interpreter: pytest configures logging itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

WORKFLOW = textwrap.dedent(
    """
    from engine import Step, WorkerTrigger, Workflow

    def charge(ctx):
        ctx.logger.warning("card refused for %s", ctx.body["order"])
        ctx.logger.info("an info line stays quiet")
        raise ValueError("declined")

    workflow = Workflow(
        name="shop.charge",
        trigger=WorkerTrigger(queue="charges", retries=0),
        steps=[Step("charge", charge)],
    )
    """
)

SCRIPT = textwrap.dedent(
    """
    import logging, sys
    import anyio
    if sys.argv[1] == "configured":
        logging.basicConfig(format="APP %(name)s: %(message)s")
    elif sys.argv[1] == "silenced":
        logging.lastResort = None
    from engine import Engine

    async def main():
        async with Engine(workflows=sys.argv[2]) as engine:
            job_id = await engine.enqueue("charges", {"order": "A1"})
            run = await engine.wait_for_job(job_id, timeout=10)
            print(run.id, job_id)

    anyio.run(main)
    """
)


def _stderr(tmp_path: Path, how: str) -> tuple[str, list[str]]:
    (tmp_path / "workflows").mkdir(exist_ok=True)
    (tmp_path / "workflows" / "charge.py").write_text(WORKFLOW)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, str(tmp_path / "workflows")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.splitlines()


@pytest.mark.parametrize("how", ["unconfigured", "configured", "silenced"])
def test_a_runs_warnings_name_the_run_and_step_until_logging_is_configured(
    tmp_path: Path, how: str
) -> None:
    printed, lines = _stderr(tmp_path, how)
    run_id, job_id = printed.split()
    failed = (
        f"shop.charge failed (no retries: {job_id} moved to the dead-letter queue): "
        "[step 1/1] charge failed: declined (at workflows/charge.py:7)"
    )
    if how == "unconfigured":
        assert lines == [
            f"WARNING blok.run.shop.charge [{run_id} charge]: card refused for A1",
            f"WARNING blok.runs [{run_id} charge]: {failed}",
        ]
    elif how == "configured":  # the application's format, each line once
        assert lines == [
            "APP blok.run.shop.charge: card refused for A1",
            f"APP blok.runs: {failed}",
        ]
    else:
        assert lines == []
