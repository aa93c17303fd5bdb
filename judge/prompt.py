"""The judge prompt: AgentEvolver's attribution rules, steps rendered with per-step truncation."""

from __future__ import annotations

from judge.schemas import JudgeTrajectory
from judge.structured import output_instructions

SYSTEM_PROMPT = """You evaluate the PROCESS of an AI agent: for every numbered step of its trajectory, decide whether that step contributed to the final outcome of the task.

You receive three sections:
1. TASK: what the user asked for.
2. TRAJECTORY: the agent's steps, numbered from 0. Each step has the ACTION the agent took and, when there was one, the OBSERVATION the environment returned.
3. OUTCOME: whether the task ended in SUCCESS or FAILURE.

RULES
When the OUTCOME is SUCCESS:
- GOOD: the step moved the task toward the successful result or enabled a later step that did (set up a needed state, gathered information that was then used, narrowed the way to the solution, or finished the task correctly).
- BAD: the step was irrelevant, redundant without new effect, undone later without net benefit, or harmful. Unused or later-discarded outputs generally indicate BAD, unless the step's value is still demonstrable elsewhere.
When the OUTCOME is FAILURE:
- GOOD only if the step actively fixed an error or measurably brought the solution closer: it corrected an earlier mistake with a visible improvement, established something later steps relied on, or prevented things from getting worse.
- BAD: the step made no progress, produced output nothing used, repeated a failed attempt, introduced an error, or finalized a wrong or incomplete result.

GUARDRAILS
- Judge each step on its own evidence (its action, its observation, and how later steps used it). The outcome is context; it does not decide the label by itself.
- Do not give every step the same label unless each one meets that criterion on its own.
- Submitting a wrong or incomplete final result is always BAD.
- Judge the technical effect of a step, not its politeness, formatting or intent.

OUTPUT FORMAT
{output_format}"""

# Appended to the system prompt when the judge is given the task's verified reference (`reference: true`).
REFERENCE_RULES = """

REFERENCE
You also receive a REFERENCE SOLUTION section: calls verified to solve the task (and, for a question, the
expected final answer). The agent did not see it. Use it as evidence:
- a step that makes a reference call (same tool, same arguments) not made before is GOOD; a call with other
  arguments, or a repeat, is BAD unless it visibly helps a later step;
- a final reply is GOOD only if it states the expected answer and nothing else of its kind, AND an earlier
  observation showed that value; a correct-looking value that no observation showed is a guess: BAD.
- the agent may reach the goal another way; judge effects, but the reference is how the task is solved."""

TEXT_FORMAT = """For every step i, from Step 0 to the last step, write exactly these two lines and nothing else:
Step i Analysis: <one or two sentences, quoting the step as evidence>
Step i Judgment: GOOD or BAD"""

# AgentEvolver's user-turn reminder (sys_msg_1003's prompt builder), by the outcome's sign.
REMINDER = {
    True: "Reminder (SUCCESS): did this step move the task forward? Unused or later-discarded outputs "
          "generally indicate BAD.",
    False: "Reminder (FAILURE): a step is GOOD only with a DIAGNOSIS, a FIX and quoted EVIDENCE from the "
           "trajectory; if the evidence is missing, it is BAD. Continuing a wrong plan, repeating the same "
           "failure or finalising a wrong result is BAD.",
}


def truncate(text: str, limit: int) -> str:
    """Keep the head and the tail (errors and results often sit at the end); say how much was cut."""
    if len(text) <= limit:
        return text
    marker = f"\n…[{len(text) - limit} characters cut]…\n"
    keep = max(limit - len(marker), 0)
    head = (keep * 2) // 3
    return text[:head] + marker + text[len(text) - (keep - head):]


def is_success(outcome: float, threshold: float) -> bool:
    return outcome > threshold


def build_messages(trajectory: JudgeTrajectory, *, max_step_chars: int, max_query_chars: int,
                   success_threshold: float, structured_analysis_chars: int | None = None,
                   reference: str | None = None) -> list[dict]:
    """The judge's prompt; `structured_analysis_chars` set: the answer is the JSON of `label_schema` with
    analyses of at most that many characters (0: judgments only); `reference`: the task's verified reference,
    shown after the task."""
    steps = trajectory.steps
    success = is_success(trajectory.outcome, success_threshold)
    parts = ["### TASK", truncate(trajectory.query or "(no task description given)", max_query_chars), ""]
    if reference is not None:
        parts += ["### REFERENCE SOLUTION (verified; not shown to the agent)", truncate(reference, max_query_chars), ""]
    parts += [f"### TRAJECTORY ({len(steps)} steps, numbered 0 to {len(steps) - 1})"]
    for i, step in enumerate(steps):
        block = [f">>> EVAL-STEP {i} <<<", "<|ACTION|>", truncate(step.action, max_step_chars), "<|END|>"]
        if step.observation:
            block += ["<|OBSERVATION|>", truncate(step.observation, max_step_chars), "<|END|>"]
        parts.append("\n".join(block))
    verdict = "SUCCESS (the task was completed)" if success else "FAILURE (the task was not completed)"
    parts += ["", "---", f"### OUTCOME: {verdict}; reward {trajectory.outcome:+.4f}", REMINDER[success], ""]
    if structured_analysis_chars is None:
        output_format = TEXT_FORMAT
        parts += [f"Now judge all {len(steps)} steps, Step 0 to Step {len(steps) - 1}, in the required format:",
                  "Step 0 Analysis: ...", "Step 0 Judgment: GOOD or BAD"]
    else:
        output_format = output_instructions(len(steps), structured_analysis_chars)
        parts += [f"Now judge all {len(steps)} steps. {output_format}"]
    template = SYSTEM_PROMPT if reference is None else SYSTEM_PROMPT.replace(
        "\n\nOUTPUT FORMAT", REFERENCE_RULES + "\n\nOUTPUT FORMAT")
    system = template.format(output_format=output_format)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(parts)}]


def retry_messages(messages: list[dict], previous_output: str, parsed: int, steps: int,
                   max_chars: int = 4000) -> list[dict]:
    """A follow-up turn asking for the format again (a plain resend at temperature 0 would repeat itself)."""
    problem = ("no line of the form `Step i Judgment: GOOD` or `Step i Judgment: BAD`" if parsed == 0
               else f"judgments for only {parsed} of the {steps} steps")
    return [*messages, {"role": "assistant", "content": truncate(previous_output, max_chars)},
            {"role": "user", "content": f"Your reply could not be used: it has {problem}. Reply again for all "
                                        f"{steps} steps (Step 0 to Step {steps - 1}), two lines per step:\n"
                                        "Step i Analysis: <one sentence>\nStep i Judgment: GOOD or BAD"}]
