"""An environment plugin written only in tests/ (external_plugins=[tests/plugins/quiz_env.py]):
asks the policy two more sums after its first answer, rewards each answer with 0.25, then ends.
It ignores what the policy says, so every episode of the tiny arith model has three turns."""

from dagrl.tools import StepResult, register_environment


class QuizEnvironment:
    QUESTIONS = ("12+34=", "5+6=")

    def __init__(self):
        self.asked = 0

    def reset(self, row: dict) -> None:
        self.asked = 0
        self.row = row

    def step(self, action: str) -> StepResult:
        if self.asked == len(self.QUESTIONS):
            return StepResult(None, reward=0.25, done=True, info={"quiz/answers": 1.0})
        self.asked += 1
        return StepResult(self.QUESTIONS[self.asked - 1], reward=0.25, info={"quiz/answers": 1.0})


@register_environment("quiz")
def quiz(settings, tools, pool) -> QuizEnvironment:
    return QuizEnvironment()
