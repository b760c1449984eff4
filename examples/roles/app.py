"""A job with roles: Lightning trainers that ask a scorer role for the mean of their losses.

    python examples/roles/app.py                               # trainer 2 x 2 + scorer 1 x 1, on this host
    python examples/roles/app.py hydra.launcher.dry_run=true   # each role's nodes, command and environment
    python examples/roles/app.py roles.scorer.num_nodes=1,2    # a sweep over the scorer's node count

One task function runs in every process; ``MMT_ROLE`` says which role it is. Each role has its own rank contract
(the trainer's four ranks form their own torch.distributed world) and every role's address and port:
``MMT_ROLE_SCORER_ADDRS`` and ``MMT_ROLE_SCORER_PORT`` tell a trainer where the scorer listens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
from omegaconf import DictConfig


def whoami() -> str:
    role = os.environ["MMT_ROLE"]
    others = [r for r in os.environ["MMT_ROLES"].split(",") if r != role]
    where = " ".join(
        f"{r}@{os.environ[f'MMT_ROLE_{r.upper()}_ADDRS']}:{os.environ[f'MMT_ROLE_{r.upper()}_PORT']}" for r in others
    )
    line = (
        f"ROLE {role} rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} "
        f"(node {os.environ['NODE_RANK']}); others: {where}"
    )
    print(line, flush=True)
    return line


# --------------------------------------------------------------------------------------------------- scorer


class Scores:
    """The losses every trainer rank sent, and their running mean."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count, self.total = 0, 0.0
        self.ranks: set = set()

    def add(self, rank: int, loss: float) -> Dict[str, Any]:
        with self.lock:
            self.count, self.total = self.count + 1, self.total + loss
            self.ranks.add(rank)
            return {"mean_loss": self.total / self.count, "count": self.count, "ranks": len(self.ranks)}


def score(cfg: DictConfig) -> Dict[str, Any]:
    """Serve on the port mmt held for this role (node 0 only) until mmt stops the role, the trainers being done."""
    whoami()
    # mmt stops this role with SIGTERM once the trainers are done: taken here, in order, not by a handler
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if os.environ["RANK"] != "0":  # one server, on the role's node 0; the others only show their place
        signal.sigwait({signal.SIGTERM})
        return {}
    scores = Scores()
    if os.environ.get("SCORER_FAIL_AFTER"):  # tests: a scorer that raises
        time.sleep(float(os.environ["SCORER_FAIL_AFTER"]))
        raise RuntimeError("the scorer broke")

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                asked = json.loads(line)
                self.wfile.write((json.dumps(scores.add(asked["rank"], asked["loss"])) + "\n").encode())

    class Server(socketserver.ThreadingTCPServer):
        # mmt holds the role's port until the job ends (bound, never listening, SO_REUSEADDR): bind it the same way
        allow_reuse_address = True
        daemon_threads = True

    server = Server(("", int(os.environ["MMT_ROLE_SCORER_PORT"])), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"SCORER listening on port {os.environ['MMT_ROLE_SCORER_PORT']}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})  # mmt stops the role once the primary role has ended
    # within mmt's kill grace: the summary first; the server's threads are daemons and go with the process
    with scores.lock:
        summary = {"count": scores.count, "ranks": len(scores.ranks), "mean_loss": scores.total / max(1, scores.count)}
    Path(os.environ["MMT_JOB_DIR"], "scorer.json").write_text(json.dumps(summary))
    print(f"SCORER done: {summary}", flush=True)
    return summary


# --------------------------------------------------------------------------------------------------- trainer


class ScorerClient:
    """One connection from a trainer rank to the scorer, opened on first use (the scorer may still be starting)."""

    def __init__(self) -> None:
        self.address = (os.environ["MMT_ROLE_SCORER_ADDRS"].split(",")[0], int(os.environ["MMT_ROLE_SCORER_PORT"]))
        self.conn: Optional[socket.socket] = None

    def ask(self, rank: int, loss: float) -> Dict[str, Any]:
        if self.conn is None:
            deadline = time.monotonic() + 60
            while True:
                try:
                    self.conn = socket.create_connection(self.address, timeout=30)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            self.reader = self.conn.makefile("rb")
        self.conn.sendall((json.dumps({"rank": rank, "loss": loss}) + "\n").encode())
        return json.loads(self.reader.readline())


def train(cfg: DictConfig) -> Dict[str, Any]:
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    whoami()
    client = ScorerClient()
    last: Dict[str, Any] = {}

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            if (self.global_step + 1) % cfg.score_every == 0:
                last.update(client.ask(self.global_rank, float(loss)))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    generator = torch.Generator().manual_seed(cfg.seed)
    x = torch.randn(512, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    L.seed_everything(cfg.seed, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        strategy="ddp",
        num_nodes=int(os.environ["NUM_NODES"]),  # the trainer role's own world, not the job's
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=cfg.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True))
    print(f"TRAINER rank {trainer.global_rank} scorer said {last}", flush=True)
    return {"scorer_mean_loss": last.get("mean_loss"), "scored": last.get("count"), "steps": trainer.global_step}


@hydra.main(version_base="1.3", config_path="conf", config_name="app")
def main(cfg: DictConfig) -> Dict[str, Any]:
    return score(cfg) if os.environ.get("MMT_ROLE") == "scorer" else train(cfg)


if __name__ == "__main__":
    main()
