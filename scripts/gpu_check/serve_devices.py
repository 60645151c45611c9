"""`rmkit serve --device DEVICE` scores as `--device cpu` does: real servers over HTTP, tiny random Llama
classifiers with one and three labels, texts of different lengths in one request, conversations, a single
text. Exits 1 when any score differs by more than 1e-4.

    python scripts/gpu_check/serve_devices.py cuda
"""

import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests" / "serve")]

from serve_helpers import build_model_dir  # noqa: E402

from rmkit.serve.client import RewardClient  # noqa: E402
from rmkit.serve.process import ServerProcess  # noqa: E402

TEXTS = ["a", "hello there, how are you today?", "x " * 40, "short", "the quick brown fox jumps over the lazy dog " * 3]
CONVERSATIONS = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello " * k}] for k in (1, 5, 17)]


def served_scores(model_dir: Path, device: str) -> list[float]:
    """Every score one server gives, flattened: the texts together, the conversations, one text alone."""
    with ServerProcess(model_dir, "--device", device, "--max-length", "64",
                       env={"PYTHONPATH": str(REPO_ROOT)}) as server, RewardClient(server.url) as client:
        answers = [*client.score_texts(TEXTS), *client.score_conversations(CONVERSATIONS), *client.score_texts(TEXTS[:1])]
    return [x for row in answers for x in (row if isinstance(row, list) else [row])]


def main() -> int:
    device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    tmp = Path(tempfile.mkdtemp())
    worst = 0.0
    for labels in (1, 3):
        model_dir = build_model_dir(tmp / f"labels{labels}", num_labels=labels, seed=labels)
        cpu, other = served_scores(model_dir, "cpu"), served_scores(model_dir, device)
        assert len(cpu) == len(other)
        diff = max(abs(a - b) for a, b in zip(cpu, other))
        print(f"{labels} label(s): {len(cpu)} scores, largest |cpu - {device}| {diff:.2e}")
        worst = max(worst, diff)
    print("OK" if worst <= 1e-4 else f"FAILED: {worst:.2e} > 1e-4")
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
