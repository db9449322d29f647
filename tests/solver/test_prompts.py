"""Solver prompts hold the description, signature and every visible example, computed outputs included."""

from generator.schema import Task
from solver.parse import extract_code
from solver.prompts import answer_text, humaneval_prompt, task_prompt


def make_task():
    return Task(
        id="t1",
        family="list_int",
        source="procedural",
        split="train",
        level=1,
        description="Sort the numbers.",
        entry_point="solve",
        signature="def solve(xs: list[int]) -> list[int]",
        reference_solution="def solve(xs):\n    return sorted(xs)\n",
        visible_tests=[{"input": [[3, 1]], "output": [1, 3]}, {"input": [["x" * 1000]], "output": None}],
    )


def test_task_prompt():
    p = task_prompt(make_task())
    assert "Sort the numbers." in p and "def solve(xs: list[int])" in p
    assert "solve([3, 1]) == [1, 3]" in p
    assert "..." in p and len(p) < 1000  # long values are cut
    assert "ACTION:" in task_prompt(make_task(), multi_turn=True)


def test_answer_round_trips_through_the_parser():
    code = make_task().reference_solution
    assert extract_code(answer_text(code)).code == code
    assert "def f" in humaneval_prompt("def f(x):\n    '''doc'''\n")


def test_conversation_adds_answers_and_feedback_in_later_turns():
    from solver.prompts import conversation, render

    task = make_task()
    msgs = conversation(
        task, turns=[("ACTION: run", "1/2 visible tests pass"), ("ACTION: check", "parses: yes")], multi_turn=True
    )
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"] == task_prompt(task, multi_turn=True)
    assert msgs[2]["content"] == "Result:\n1/2 visible tests pass"
    text = render(msgs)  # no tokenizer: plain headers, ending with the generation prompt
    assert text.startswith("### User:\nSort the numbers.") and text.endswith("### Assistant:\n")
    assert text.count("### Assistant:\n") == 3 and "Result:\nparses: yes" in text
    assert not render(msgs[:1], add_generation_prompt=False).endswith("### Assistant:\n")
