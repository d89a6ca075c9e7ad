"""Shared by the training-job tests: small-run flags and a callback that stops a run early (their one intra-op
thread is conftest.py's `single_thread` fixture)."""

from transformers import TrainerCallback

# A few steps of any tiny config: enough to train, save, evaluate and write a card.
SMALL = [
    *("--max_steps", "2", "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"),
    *("--max_train_blocks", "32", "--max_eval_blocks", "4", "--train_examples_per_task", "16"),
    *("--eval_examples_per_task", "4", "--per_device_train_batch_size", "4"),
]


class StopAt(TrainerCallback):
    """Ends training after `step` optimizer steps, as an interrupted run would (its checkpoints stay)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control


class CountSteps(TrainerCallback):
    """The optimizer steps a run actually executes (a resume that ignored its checkpoint would execute them all)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)
