"""Shared by the training-job tests: one intra-op thread, small-run flags, a callback that stops a run early."""

import pytest
import torch
from transformers import TrainerCallback

# A few steps of any tiny config: enough to train, save, evaluate and write a card.
SMALL = [
    *("--max_steps", "2", "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"),
    *("--max_train_blocks", "32", "--max_eval_blocks", "4", "--train_examples_per_task", "16"),
    *("--eval_examples_per_task", "4", "--per_device_train_batch_size", "4"),
]


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """Micro models: a second intra-op thread costs more than it saves (and collapses on a busy machine).
    Import it into a test module (`from helpers_training import single_thread`) to apply it there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class StopAt(TrainerCallback):
    """Ends training after `step` optimizer steps, as an interrupted run would (its checkpoints stay)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control
