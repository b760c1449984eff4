"""The app's model and data: a small MLP regressing a fixed random teacher on synthetic data (no downloads)."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, n_features: int, hidden: int, lr: float) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class SyntheticData(L.LightningDataModule):
    """y = x @ w + noise, with x and w drawn from a fixed seed: the same data in every process."""

    def __init__(self, n_samples: int, n_features: int, batch_size: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(n_samples, n_features, generator=generator)
        w = torch.randn(n_features, 1, generator=generator)
        y = x @ w + 0.1 * torch.randn(n_samples, 1, generator=generator)
        split = n_samples * 3 // 4
        self.train_set = TensorDataset(x[:split], y[:split])
        self.val_set = TensorDataset(x[split:], y[split:])
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size)
