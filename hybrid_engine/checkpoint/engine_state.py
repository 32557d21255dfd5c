"""The engine's training state in a grid-independent form: what checkpoints save and load, on any grid.

Every tensor is keyed by its global name in the whole model's state_dict ("<module index>.<name>"), stored whole
(gathered over MP) on the CPU; loading slices each back to this rank's MP shard. With half weights the fp32
masters are what is saved and loaded (the half weights are their cast).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from hybrid_engine.parallel.tensor.layers import copy_placement, gather_full, take_shard


class EngineState:
    """Mixed into Engine: reads its stages, the tensors its optimizer steps, the optimizer and the scaler."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's layers as full tensors (gathered over MP) on the CPU, keyed like the whole model's
        state_dict ("<module index>.<name>"), whatever the grid. Every rank must call it (MP all-gathers)."""
        if self.zero is not None:  # the sharded fp32 masters, gathered over DP too
            weights, _ = self.zero.full_state(self._global_names(), with_optimizer=False)
            return {name: weights[name] for name in self.checkpoint_names()}
        weights = dict(zip(map(id, self.parameters), self.optimized))  # fp32 masters when weights are half
        state: dict[str, torch.Tensor] = {}
        for s in self.stage_ids:
            for name, param in self.stages[s].named_parameters():
                local, _, leaf = name.partition(".")
                full = gather_full(weights[id(param)], self.groups.mp)
                state[f"{self.stage_layer_indices[s][int(local)]}.{leaf}"] = full.cpu()
        return state

    def _checkpoint_tensors(self) -> list[tuple[str, nn.Parameter, torch.Tensor]]:
        """(global name, model parameter, the tensor the optimizer steps: the fp32 master with half weights)."""
        stepped = dict(zip(map(id, self.parameters), self.optimized))
        out = []
        for s in self.stage_ids:
            for name, param in self.stages[s].named_parameters():
                local, _, leaf = name.partition(".")
                out.append((f"{self.stage_layer_indices[s][int(local)]}.{leaf}", param, stepped[id(param)]))
        return out

    def _global_names(self) -> dict[int, str]:
        return {id(param): name for name, param, _ in self._checkpoint_tensors()}

    @property
    def schedule_name(self) -> str:
        """The schedule's name, as checkpoint manifests record it ("schedule")."""
        return self.schedule.name

    def checkpoint_names(self) -> list[str]:
        """Global names ("<module index>.<weight|bias>") of this rank's parameters."""
        return [name for name, _, _ in self._checkpoint_tensors()]

    def state_for_checkpoint(self) -> dict:
        """This rank's training state in a grid-independent form, on the CPU: "weights" and per-parameter
        "optimizer" state as full tensors (gathered over MP) keyed by global parameter name, and the loss
        scaler's state (None without one). Every rank must call it (MP all-gathers, in the same order)."""
        scaler = getattr(self, "scaler", None)
        scaler_state = scaler.state_dict() if scaler else None
        if self.zero is not None:
            weights, optimizer = self.zero.full_state(self._global_names())
            return {"weights": weights, "optimizer": optimizer, "scaler": scaler_state}
        weights, optimizer = {}, {}
        for name, param, stepped in self._checkpoint_tensors():
            weights[name] = gather_full(stepped, self.groups.mp).cpu()
            optimizer[name] = {}
            for key, value in self.optimizer.state.get(stepped, {}).items():
                if torch.is_tensor(value) and value.shape == stepped.shape:  # a per-element state: a shard
                    value = gather_full(copy_placement(param, value.detach()), self.groups.mp)
                optimizer[name][key] = value.detach().cpu().clone() if torch.is_tensor(value) else value
        return {"weights": weights, "optimizer": optimizer, "scaler": scaler_state}

    @torch.no_grad()
    def load_checkpoint_state(self, weights: dict, optimizer: dict, scaler: dict | None) -> None:
        """Inverse of state_for_checkpoint, on any grid: every full tensor of this rank's parameters is sliced
        to this rank's MP shard. No collectives. A scaler state is restored only if this run has a scaler."""
        if self.zero is not None:
            self.zero.load_state(self._global_names(), weights, optimizer)
        for name, param, stepped in ([] if self.zero is not None else self._checkpoint_tensors()):
            full = weights[name]
            stepped.copy_(take_shard(full, like=param, mp_group=self.groups.mp))
            if stepped is not param:
                param.copy_(stepped)  # half weights: the one cast, as after an optimizer step
            state = {}
            for key, value in optimizer.get(name, {}).items():
                if torch.is_tensor(value) and value.shape == full.shape and value.dim() > 0:
                    value = take_shard(value, like=param, mp_group=self.groups.mp).to(stepped.device)
                state[key] = value.clone() if torch.is_tensor(value) else value
            if state:
                self.optimizer.state[stepped] = state
            else:
                self.optimizer.state.pop(stepped, None)
        own_scaler = getattr(self, "scaler", None)
        if own_scaler is not None and scaler is not None:
            own_scaler.load_state_dict(scaler)
