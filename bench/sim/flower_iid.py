"""Flower's simulation of the federation of configs/iid.json: the baseline of compare_flower.sh.

    .venv-flower/bin/python bench/sim/flower_iid.py --config configs/iid.json [--rounds 2] [--out r.json]

What it runs (Flower 1.42's message API, run_simulation on Ray, scripts/setup.sh --flower):
  - data.train_path shuffled (seed) and dealt in contiguous runs to simulation.num_clients clients,
    the sizes of fedlora's IID partition; data.eval_path is the server's held-out split.
  - Each round FedAvg samples selection.clients_per_round clients; each trains the global adapter
    for training.local_steps AdamW steps of training.batch_size examples (constant rate, gradient
    clipping, a fresh optimizer every task) and returns it weighted by its size.
  - The model: HF BertForSequenceClassification from model.path (local files) with PEFT LoRA on
    lora.target_modules; SEQ_CLS makes the classifier trainable too. Only the trainable tensors
    (LoRA A/B and the classifier) travel. Inputs are cut at model.max_seq_len and padded to the
    longest in the batch.
  - The server evaluates the global model on the held-out split (batch data.eval_batch_size)
    before round 1, every data.eval_every_rounds rounds and after the last.
  - Ray gets 2 CPUs and each client 1, so two clients train at once, one torch thread each.
Each Ray worker process builds the model once and reuses it: every task overwrites all trainable
tensors with the global ones, which is the same as building it afresh.
"""

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from peft import LoraConfig, TaskType, get_peft_model
from transformers import AutoTokenizer, BertForSequenceClassification

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def run_config(path: str) -> dict:
    """The run config, its relative paths made absolute: as fedlora reads them, relative to the config's directory."""
    file = REPO / path
    cfg = json.loads(file.read_text())
    for section, key in (("model", "path"), ("data", "train_path"), ("data", "eval_path")):
        if cfg.get(section, {}).get(key):
            cfg[section][key] = str((file.parent / cfg[section][key]).resolve())
    return cfg


@functools.cache
def tokenizer(model_path: str):
    return AutoTokenizer.from_pretrained(REPO / model_path)


@functools.cache
def peft_model(config_path: str):
    """The LoRA model of the run config, built once per process."""
    cfg = run_config(config_path)
    base = BertForSequenceClassification.from_pretrained(
        REPO / cfg["model"]["path"], num_labels=len(cfg["task"]["labels"])
    )
    lora = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=cfg["lora"]["rank"],
        lora_alpha=cfg["lora"]["alpha"],
        target_modules=cfg["lora"]["target_modules"],
        lora_dropout=0.0,
    )
    return get_peft_model(base, lora)


@functools.cache
def load_split(config_path: str, path: str) -> tuple[list[str], list[int]]:
    cfg = run_config(config_path)
    label_ids = {name: i for i, name in enumerate(cfg["task"]["labels"])}
    texts, labels = [], []
    for line in (REPO / path).read_text().splitlines():
        row = json.loads(line)
        texts.append(row[cfg["task"]["text_field"]])
        labels.append(label_ids[row[cfg["task"]["label_field"]]])
    return texts, labels


def iid_partition(n: int, num_clients: int, seed: int, client: int) -> list[int]:
    """Client `client`'s indices: a seeded shuffle dealt in contiguous runs of n/N (+1)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    base, extra = divmod(n, num_clients)
    start = client * base + min(client, extra)
    return order[start : start + base + (client < extra)]


def encode(config_path: str, texts: list[str]) -> dict:
    cfg = run_config(config_path)
    return tokenizer(cfg["model"]["path"])(
        texts, truncation=True, max_length=cfg["model"]["max_seq_len"], padding="longest",
        return_tensors="pt",
    )


def trainable_state(model) -> dict:
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model, arrays: ArrayRecord) -> None:
    missing, unexpected = model.load_state_dict(arrays.to_torch_state_dict(), strict=False)
    assert not unexpected and not [n for n in missing if n in trainable_state(model)]


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    config = msg.content["config"]
    config_path, server_round = config["config-path"], config["server-round"]
    cfg = run_config(config_path)
    training = cfg["training"]
    client = context.node_config["partition-id"]

    model = peft_model(config_path)
    load_trainable(model, msg.content["arrays"])
    model.train()
    texts, labels = load_split(config_path, cfg["data"]["train_path"])
    mine = iid_partition(len(texts), context.node_config["num-partitions"], cfg["seed"], client)

    # This task's shuffle and dropout, seeded by (seed, round, client).
    torch.manual_seed(cfg["seed"] * 1_000_003 + server_round * 1009 + client)
    order = [mine[i] for i in torch.randperm(len(mine)).tolist()]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=training["learning_rate"], weight_decay=0.0)
    batch, losses = training["batch_size"], []
    for step in range(training["local_steps"]):
        idx = [order[(step * batch + i) % len(order)] for i in range(batch)]
        inputs = encode(config_path, [texts[i] for i in idx])
        loss = model(**inputs, labels=torch.tensor([labels[i] for i in idx])).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, training["grad_clip_norm"])
        optimizer.step()
        losses.append(loss.item())

    reply = RecordDict({
        "arrays": ArrayRecord(trainable_state(model)),
        "metrics": MetricRecord({"num-examples": len(mine), "train-loss": sum(losses) / len(losses)}),
    })
    return Message(content=reply, reply_to=msg)


@torch.no_grad()
def evaluate(config_path: str, arrays: ArrayRecord) -> float:
    cfg = run_config(config_path)
    model = peft_model(config_path)
    load_trainable(model, arrays)
    model.eval()
    texts, labels = load_split(config_path, cfg["data"]["eval_path"])
    batch, correct = cfg["data"]["eval_batch_size"], 0
    for start in range(0, len(texts), batch):
        logits = model(**encode(config_path, texts[start : start + batch])).logits
        correct += (logits.argmax(-1) == torch.tensor(labels[start : start + batch])).sum().item()
    return correct / len(texts)


def make_server_app(config_path: str, rounds: int, results: dict) -> ServerApp:
    cfg = run_config(config_path)
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        num_clients = cfg["simulation"]["num_clients"]
        per_round = cfg["selection"]["clients_per_round"]
        strategy = FedAvg(
            fraction_train=per_round / num_clients,
            min_train_nodes=per_round,
            min_available_nodes=num_clients,
            fraction_evaluate=0.0,  # no client-side evaluation: the server evaluates
        )
        every = cfg["data"]["eval_every_rounds"]

        def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round % every and server_round != rounds:
                return None
            accuracy = evaluate(config_path, arrays)
            results["accuracy"][server_round] = accuracy
            print(f"flower_iid: round {server_round} accuracy {accuracy:.4f}", flush=True)
            return MetricRecord({"accuracy": accuracy})

        torch.manual_seed(cfg["seed"])  # the initial adapter: LoRA A and the classifier
        initial = ArrayRecord(trainable_state(peft_model(config_path)))
        strategy.start(
            grid=grid,
            initial_arrays=initial,
            num_rounds=rounds,
            train_config=ConfigRecord({"config-path": config_path}),
            evaluate_fn=evaluate_fn,
        )

    return server_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/iid.json", help="fedlora run config, relative to the repository")
    parser.add_argument("--rounds", type=int, default=0, help="override the config's rounds")
    parser.add_argument("--out", help="write the accuracies and the wall time here (JSON)")
    args = parser.parse_args()

    start = time.monotonic()
    cfg = run_config(args.config)
    rounds = args.rounds or cfg["rounds"]
    random.seed(cfg["seed"])  # FedAvg samples clients with `random`
    results = {"accuracy": {}}
    # Imported by name, so that Ray's workers import this module (and keep its per-process model)
    # rather than unpickling the client functions afresh for every task.
    sys.path.insert(0, str(Path(__file__).parent))
    import flower_iid

    run_simulation(
        server_app=make_server_app(args.config, rounds, results),
        client_app=flower_iid.client_app,
        num_supernodes=cfg["simulation"]["num_clients"],
        backend_config={
            "init_args": {"num_cpus": 2, "num_gpus": 0},
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
        },
    )
    seconds = time.monotonic() - start
    final = results["accuracy"].get(rounds)
    print(f"flower_iid: {rounds} rounds in {seconds:.1f} s, final accuracy {final}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"rounds": rounds, "seconds": seconds, "final_accuracy": final, "accuracy": results["accuracy"]},
            indent=1) + "\n")


if __name__ == "__main__":
    main()
