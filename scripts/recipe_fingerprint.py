"""Train every recipe for a few steps on tiny random models and print a hash of each final model's weights.

A refactor of the training machinery must not change what a recipe computes: run this at two commits and
compare the hashes. Every run goes through the command line (`rmkit.cli.main`), with gradient accumulation,
validation and a checkpoint inside the run, on one thread (the same float operations on every run).

    python scripts/recipe_fingerprint.py --out /tmp/fp-new.json
    git worktree add /tmp/old <commit> && (cd /tmp/old && python /path/to/recipe_fingerprint.py --out /tmp/fp-old.json)

The tiny models are built here from configs, seeded, with SmolLM2's tokenizer (packaged with rmkit's
`smollm2` extra) and MiniLM's (the `minilm` extra), so the script needs nothing downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

RECIPES = ("rm_decoder", "rm_encoder", "rm_regression", "sft", "dpo", "grpo", "ppo", "prm")
STEPS = Path(__file__).resolve().parents[1] / "rmkit" / "resources" / "steps_example.jsonl"  # step-labelled solutions
QUIET = ["logger.tensorboard=false", "logger.progress_bar=false", "logger.plots=false", "policy.num_threads=1"]


def tokenizer_of(name: str):
    from rmkit.models.reward import load_tokenizer
    from rmkit.models.setup import resolve_model_name

    return load_tokenizer(resolve_model_name(name))


def tiny_decoder(path: Path, causal_lm: bool) -> str:
    """A random 2-layer Llama (hidden 32) with SmolLM2's tokenizer: a policy, or a 1-label classifier."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    tokenizer = tokenizer_of("smollm2")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=causal_lm, num_labels=1)
    model = LlamaForCausalLM(config) if causal_lm else LlamaForSequenceClassification(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tiny_encoder(path: Path, num_labels: int) -> str:
    """A random 2-layer BERT (hidden 32) with MiniLM's tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification

    tokenizer = tokenizer_of("minilm")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=512, num_labels=num_labels)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def regression_file(path: Path) -> str:
    """32 prompt/response records with two labels each, derived from the embedded preference set."""
    from rmkit.resources import __file__ as resources

    lines = (Path(resources).parent / "default_train.jsonl").read_text(encoding="utf-8").splitlines()[:16]
    with path.open("w", encoding="utf-8") as out:
        for i, line in enumerate(lines):
            record = json.loads(line)
            for j, side in enumerate(("chosen", "rejected")):
                out.write(json.dumps({"prompt": record["prompt"], "response": record[side],
                                      "label": [float(1 - j), float((i + j) % 3)]}) + "\n")
    return str(path)


def commands(work: Path) -> dict[str, list[str]]:
    """Each recipe's command line: a few optimizer steps of several micro-batches, validation at the start,
    in the middle and at the end, and a checkpoint in the middle."""
    policy, rm = tiny_decoder(work / "policy", True), tiny_decoder(work / "rm", False)
    small_ckpt = ["checkpointing.save_period=2", "checkpointing.keep_top_k=null"]
    rm_loop = ["rm.max_num_steps=4", "rm.val_period=2", "rm.val_batches=1", "rm.val_global_batch_size=8",
               "policy.train_global_batch_size=8", "policy.train_micro_batch_size=2", "policy.optimizer.lr=1e-3",
               "policy.max_total_sequence_length=96", *small_ckpt]
    return {
        "rm_decoder": ["train", f"policy.model_name={rm}", *rm_loop],
        "rm_encoder": ["train", f"policy.model_name={tiny_encoder(work / 'encoder', 1)}", *rm_loop],
        "rm_regression": ["train", f"policy.model_name={tiny_encoder(work / 'encoder2', 2)}", *rm_loop,
                          "policy.reward_model_cfg.reward_model_type=regression", "policy.reward_model_cfg.num_labels=2",
                          "data.format=regression", f"data.train_data_path={regression_file(work / 'reg.jsonl')}",
                          f"data.val_data_paths={{default: {work / 'reg.jsonl'}}}"],
        "sft": ["sft", f"policy.model_name={policy}", "sft.max_num_steps=4", "sft.val_period=2", "sft.val_batches=1",
                "sft.val_global_batch_size=4", "sft.val_micro_batch_size=2", "sft.num_sample_generations=2",
                "sft.sample_max_new_tokens=4", "policy.train_global_batch_size=8", "policy.train_micro_batch_size=2",
                "policy.optimizer.lr=1e-3", "policy.max_total_sequence_length=96", *small_ckpt],
        "dpo": ["dpo", f"policy.model_name={policy}", "dpo.max_num_steps=4", "dpo.val_period=2", "dpo.val_batches=1",
                "dpo.val_global_batch_size=4", "dpo.val_micro_batch_size=2", "dpo.num_sample_generations=2",
                "dpo.sample_max_new_tokens=4", "policy.train_global_batch_size=8", "policy.train_micro_batch_size=2",
                "policy.optimizer.lr=1e-3", "policy.scheduler.warmup_steps=1", "policy.max_total_sequence_length=96",
                *small_ckpt],
        "grpo": ["grpo", f"policy.model_name={policy}", f"env.reward_model.model_name={rm}", "grpo.max_num_steps=3",
                 "grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=2", "grpo.val_period=2",
                 "grpo.max_val_samples=4", "policy.train_global_batch_size=4", "policy.train_micro_batch_size=2",
                 "policy.generation.max_new_tokens=6", "policy.max_total_sequence_length=128",
                 "policy.optimizer.lr=1e-3", "policy.scheduler.name=cosine", "data.train_data_path=default",
                 "data.val_data_paths={val: default-val}", *small_ckpt],
        "ppo": ["ppo", f"policy.model_name={policy}", f"env.reward_model.model_name={rm}", "ppo.max_num_steps=3",
                "ppo.num_prompts_per_step=4", "ppo.num_generations_per_prompt=2", "ppo.val_period=2", "ppo.ppo_epochs=2",
                "ppo.max_val_samples=4", "ppo.kl_target=0.01", "policy.train_global_batch_size=4",
                "policy.train_micro_batch_size=2", "value.train_micro_batch_size=1", "policy.generation.max_new_tokens=6",
                "policy.max_total_sequence_length=128", "policy.optimizer.lr=1e-3", "policy.scheduler.name=cosine",
                "value.optimizer.lr=1e-3",
                "data.train_data_path=default", "data.val_data_paths={val: default-val}", *small_ckpt],
        "prm": ["train", f"policy.model_name={rm}", "prm.max_num_steps=4", "prm.max_num_epochs=3", "prm.val_period=2",
                f"data.train_data_path={STEPS}", f"data.val_data_paths={{example: {STEPS}}}",
                "checkpointing.metric_name=val:validation-example_loss", "policy.train_global_batch_size=4",
                "policy.train_micro_batch_size=2", "policy.optimizer.lr=1e-3", "policy.max_total_sequence_length=96",
                *small_ckpt],
    }


def weights_hash(final_dir: Path) -> str:
    """sha256 over the exported tensors' names (a subfolder's prefixed with it), dtypes, shapes and bytes, in name
    order."""
    digest = hashlib.sha256()
    tensors = {}
    for file in sorted(final_dir.rglob("*.safetensors")):  # PPO's critic sits in final/critic/
        folder = file.parent.relative_to(final_dir)
        tensors.update({name if folder == Path(".") else f"{folder}/{name}": t for name, t in load_file(file).items()})
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write {recipe: hash} as JSON here too")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="comma list of " + ", ".join(RECIPES))
    args = parser.parse_args(argv)
    from rmkit.cli import main as rmkit_main

    torch.set_num_threads(1)
    hashes = {}
    with tempfile.TemporaryDirectory(prefix="rmkit-fingerprint-") as tmp:
        work = Path(tmp)
        runs = commands(work)
        for name in args.recipes.split(","):
            out = work / "runs" / name
            status = rmkit_main([*runs[name], f"checkpointing.checkpoint_dir={out}", *QUIET])
            if status != 0:
                print(f"recipe_fingerprint: {name} exited {status}", file=sys.stderr)
                return status
            hashes[name] = weights_hash(out / "final")
            print(f"{name:14s} {hashes[name]}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(hashes, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
