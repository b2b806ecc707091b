"""Lab 11-05 — your batched LoRA, serving mini_vllm's adapters (your implementation).

mini_vllm serves several PEFT adapters and the base model in one batch. Every
linear layer it wraps (``qkv_proj``, ``o_proj``, ``gate_up_proj``,
``down_proj``) computes the base output ``y = x @ W.T`` and then hands ``y`` to
a *Punica wrapper*, an object with three members, which adds each row's adapter
into ``y`` in place:

* ``update_metadata(token_lora_indices)``: called once per step, before the
  forward pass, with the adapter *slot* of every row of the flat batch (``-1``:
  the row belongs to a base-model request);
* ``no_lora``: read by every wrapped layer; ``True`` lets the layer skip the
  LoRA work for a step in which no row has an adapter;
* ``add_lora_linear(y, x, lora_a_stacked, lora_b_stacked, scale,
  output_slices)``: the work itself, once per wrapped layer per step.

``engine.lora_manager.set_punica_wrapper(w)`` swaps mini_vllm's own wrapper for
any object with those members. Here you write one, ``MyPunicaWrapper``, plus
``token_lora_indices``, the function that turns a step's requests into the
per-row slots the wrapper is given; ``plug_into(engine, wrapper)`` (given)
installs both. The tests then run mixed batches of three adapters and the base
model through the engine with two slots, with chunked prefill, prefix caching
and preemption, and require every request's greedy tokens to equal those of the
same request run alone.

The contract has one rule that matters more than the others: a row whose slot
is ``-1`` must leave ``add_lora_linear`` with exactly the bits it came in with.
In numpy (and torch) ``stack[-1]`` is the last slot, not an error.

upstream: vllm/lora/punica_wrapper/punica_base.py:22 PunicaWrapperABC
upstream: vllm/lora/punica_wrapper/punica_base.py:385 add_lora_linear
upstream: vllm/lora/punica_wrapper/utils.py:54 convert_mapping
upstream: vllm/lora/layers/base_linear.py:206 _apply_lora_to_output
"""
from __future__ import annotations

import numpy as np

NO_LORA = -1  # the slot of a row that uses the base model


# ---------------------------------------------------------------- given: argument checks


def _check_mapping(lora_int_ids, lora_index_to_id, query_start_loc):
    """Validate ``token_lora_indices``'s arguments; return (ids, table, qsl) normalised.

    ids: a list of ints, ``None`` turned into 0. table: ``list(lora_index_to_id)``.
    qsl: an int64 array.
    """
    table = list(lora_index_to_id)
    ids = []
    for lora_id in lora_int_ids:
        lora_id = 0 if lora_id is None else lora_id
        if isinstance(lora_id, bool) or not isinstance(lora_id, int | np.integer) or lora_id < 0:
            raise ValueError(f"lora_int_ids must hold ints >= 0 (0 or None: the base model), got {lora_id!r}")
        if lora_id and lora_id not in table:
            raise ValueError(f"lora_int_ids holds id {lora_id}, which sits in no slot of "
                             f"lora_index_to_id {table}")
        ids.append(int(lora_id))
    qsl = np.asarray(query_start_loc)
    if (qsl.ndim != 1 or len(qsl) != len(ids) + 1 or (qsl.size and not np.issubdtype(qsl.dtype, np.integer))
            or qsl[0] != 0 or np.any(np.diff(qsl) < 0)):
        raise ValueError(f"query_start_loc must be {len(ids) + 1} non-decreasing int offsets starting at 0 "
                         f"(one more than lora_int_ids), got {qsl.tolist()}")
    return ids, table, qsl.astype(np.int64)


def _check_indices(token_lora_indices, max_loras: int) -> np.ndarray:
    """Validate one step's per-row slots; return them as a 1-D int64 array."""
    idx = np.asarray(token_lora_indices)
    if idx.ndim != 1:
        raise ValueError(f"token_lora_indices must be 1-D (one slot per row), got shape {idx.shape}")
    if idx.size and not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"token_lora_indices must be integers, got dtype {idx.dtype}")
    idx = idx.astype(np.int64)
    bad = idx[(idx < NO_LORA) | (idx >= max_loras)]
    if bad.size:
        raise ValueError(f"token_lora_indices must be -1 (no adapter) or a slot in [0, {max_loras}), "
                         f"got {bad[:5].tolist()}")
    return idx


def _check_linear(y, x, lora_a_stacked, lora_b_stacked, output_slices, num_rows: int):
    """Validate ``add_lora_linear``'s arguments; return the output slices as a tuple of ints."""
    for name, arr in (("y", y), ("x", x)):
        if not isinstance(arr, np.ndarray) or arr.ndim != 2 or not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"{name} must be a 2-D float numpy array, got "
                             f"{getattr(arr, 'shape', type(arr).__name__)}")
    if len(x) != num_rows or len(y) != num_rows:
        raise ValueError(f"x has {len(x)} rows and y {len(y)}, but token_lora_indices has {num_rows}: "
                         f"call update_metadata for this batch first")
    slices = tuple(int(s) for s in output_slices)
    if not len(lora_a_stacked) == len(lora_b_stacked) == len(slices):
        raise ValueError(f"lora_a_stacked, lora_b_stacked and output_slices need one entry per slice, got "
                         f"{len(lora_a_stacked)}, {len(lora_b_stacked)} and {len(slices)}")
    if sum(slices) != y.shape[1]:
        raise ValueError(f"output_slices {slices} must sum to y's width {y.shape[1]}")
    for i, (a, b, size) in enumerate(zip(lora_a_stacked, lora_b_stacked, slices, strict=True)):
        if a.ndim != 4 or a.shape[1] != 1 or a.shape[3] != x.shape[1]:
            raise ValueError(f"lora_a_stacked[{i}] must be [max_loras, 1, max_lora_rank, {x.shape[1]}], "
                             f"got {a.shape}")
        if b.shape != (a.shape[0], 1, size, a.shape[2]):
            raise ValueError(f"lora_b_stacked[{i}] must be {(a.shape[0], 1, size, a.shape[2])}, got {b.shape}")
    return slices


# ---------------------------------------------------------------- you write: the step's slots


def token_lora_indices(lora_int_ids, lora_index_to_id, query_start_loc) -> np.ndarray:
    """One adapter slot per row of the step's flat batch (``-1``: base model).

    lora_int_ids: one entry per scheduled request, in batch order: the
    ``lora_int_id`` of its adapter (>= 1), or 0 / ``None`` for a base-model
    request. lora_index_to_id: one entry per slot, the id of the adapter that
    sits there now (``None`` for an empty slot), as the manager holds it after
    seating the step's adapters. query_start_loc: int ``[num_requests + 1]``;
    request ``i`` owns rows ``query_start_loc[i] .. query_start_loc[i + 1] - 1``
    (a prefill chunk many rows, a decode one).

    Returns int64 ``[query_start_loc[-1]]``: for every row, the *position* of
    its request's id in ``lora_index_to_id``, or ``-1`` for a base request.
    An id is a name; only the slot indexes the stacked weights.

    Raises ValueError naming ``lora_int_ids`` (a negative id, an id in no slot)
    or ``query_start_loc`` (wrong length, not starting at 0, decreasing).

    upstream: vllm/lora/punica_wrapper/utils.py:101 lora_idx
    upstream: vllm/v1/worker/gpu_input_batch.py:993 token_lora_mapping
    """
    raise NotImplementedError("token_lora_indices: map each request's id to its slot (0 -> -1), then repeat it over the request's rows")


# ---------------------------------------------------------------- you write: the wrapper


class MyPunicaWrapper:
    """Holds one step's per-row slots and adds the stacked adapters with them.

    A drop-in for mini_vllm's ``PunicaWrapperNumpy``: ``plug_into`` hands it to
    every wrapped layer of an engine. State (set up by the given ``__init__``):

    * ``max_loras``: the number of slots; valid row slots are ``-1`` and
      ``0 .. max_loras - 1``;
    * ``token_lora_indices``: int64 ``[T]``, the slots of the current step;
    * ``groups``: a list of ``(slot, rows)``, one per slot used by the current
      step, ``rows`` the int array of the rows in that slot; ``-1`` rows are in
      no group. (A suggested layout: one gather and two matmuls per adapter and
      slice. The tests only call the three public members.)
    """

    def __init__(self, max_loras: int) -> None:
        if isinstance(max_loras, bool) or not isinstance(max_loras, int | np.integer) or max_loras < 1:
            raise ValueError(f"max_loras must be an integer >= 1, got {max_loras!r}")
        self.max_loras = int(max_loras)
        self.token_lora_indices = np.zeros(0, dtype=np.int64)
        self.groups: list[tuple[int, np.ndarray]] = []

    def update_metadata(self, token_lora_indices) -> None:
        """Set the slots of the next forward pass: one per row, ``-1`` for none.

        token_lora_indices: 1-D ints in ``[-1, max_loras - 1]``. Replaces
        everything the previous step set: after this call the wrapper knows
        nothing about earlier batches (their rows, their slots, their size).
        Returns None.

        Raises ValueError naming ``token_lora_indices`` (not 1-D, not integers,
        a value outside ``[-1, max_loras - 1]``); call ``_check_indices`` first.

        upstream: vllm/lora/punica_wrapper/punica_base.py:284 update_metadata
        """
        raise NotImplementedError("update_metadata: check, store the indices, and rebuild (slot, rows) groups from scratch, -1 left out")

    @property
    def no_lora(self) -> bool:
        """True when no row of the current step has an adapter (every slot is ``-1``, or no rows).

        The wrapped layers read it before each call and skip ``add_lora_linear``
        when it is True, so a wrong True silently drops every adapter of the
        step, and a wrong False only wastes work.

        upstream: vllm/lora/punica_wrapper/utils.py:41 no_lora
        """
        raise NotImplementedError("no_lora: True when no row of this step has a slot >= 0")

    def add_lora_linear(self, y, x, lora_a_stacked, lora_b_stacked, scale: float, output_slices) -> None:
        """Add every row's adapter to the base output ``y``, in place.

        y: float32 ``[T, sum(output_slices)]``, the base layer's output.
        x: float32 ``[T, in]``, the layer's input. lora_a_stacked[i]:
        ``[max_loras, 1, max_lora_rank, in]``; lora_b_stacked[i]:
        ``[max_loras, 1, output_slices[i], max_lora_rank]``, one pair per output
        slice (q, k, v of ``qkv_proj``; gate, up of ``gate_up_proj``).
        scale: multiplies each delta once (mini_vllm and vLLM pass 1.0: the
        adapter's ``alpha / r`` is folded into B when it is loaded).

        For each row ``t`` with slot ``s >= 0`` and each slice ``i``, whose
        columns are ``offset_i .. offset_i + output_slices[i] - 1`` with
        ``offset_i`` the sum of the sizes before it::

            y[t, slice i] += scale * (x[t] @ A_i[s, 0].T) @ B_i[s, 0].T

        Rows with slot ``-1`` keep their exact bits. Returns None.

        Raises ValueError naming ``x``/``y`` (not 2-D float arrays, or a row
        count other than the last ``update_metadata``'s), ``output_slices``
        (count, or sum other than y's width), ``lora_a_stacked`` or
        ``lora_b_stacked`` (shapes); call ``_check_linear`` first.

        upstream: vllm/lora/punica_wrapper/punica_cpu.py:265 add_lora_linear
        """
        raise NotImplementedError("add_lora_linear: per slot group and per slice: y[rows, offset:offset+size] += scale * (x[rows] @ A.T) @ B.T")


# ---------------------------------------------------------------- given: into the engine


def plug_into(engine, wrapper, indices=None):
    """Make ``engine`` (an ``LLMEngine`` with ``enable_lora=True``) use ``wrapper`` and ``indices``.

    ``wrapper`` goes into every wrapped layer (``set_punica_wrapper``);
    ``indices`` (default: this module's ``token_lora_indices``) replaces the
    engine's own per-row slot computation for each step, which then runs:
    seat the batch's adapters (``set_active_adapters``), compute the rows'
    slots, store them on the model input, ``wrapper.update_metadata(slots)``.
    Returns ``engine``.
    """
    manager = engine.lora_manager
    if manager is None:
        raise ValueError("engine must be built with enable_lora=True")
    manager.set_punica_wrapper(wrapper)
    indices = token_lora_indices if indices is None else indices

    def set_lora_indices(reqs, model_input):  # the engine's _set_lora_indices, with your pieces
        manager.set_active_adapters([r.lora_request for r in reqs])
        ids = [0 if r.lora_request is None else r.lora_request.lora_int_id for r in reqs]
        model_input.token_lora_indices = indices(ids, manager.lora_index_to_id, model_input.query_start_loc)
        wrapper.update_metadata(model_input.token_lora_indices)
        return tuple(sorted({i for i in ids if i}))

    engine._set_lora_indices = set_lora_indices
    return engine


# ---------------------------------------------------------------- demo


def _demo() -> None:
    """Three adapters and the base model through two slots, checked against runs alone."""
    import pathlib
    import tempfile

    from mini_vllm import LLMEngine, LoRARequest, SamplingParams
    from mini_vllm.lora import write_peft_adapter
    from mini_vllm.models.config import tiny_random_config

    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        loras = [LoRARequest(name, i + 1, str(write_peft_adapter(pathlib.Path(tmp) / name, tiny_random_config(),
                                                                  r=8, seed=i + 1)))
                 for i, name in enumerate(("a", "b", "c"))]
        names = [loras[0], None, loras[1], loras[2], loras[0]]
        prompts = ["the quick brown fox", "the quick brown fox", "hello", "paged attention", "lora"]
        engine = plug_into(LLMEngine("tiny-random", enable_lora=True, max_loras=2, max_lora_rank=16),
                           MyPunicaWrapper(2))
        got = engine.generate(prompts, greedy, lora_request=names)
        for step in engine.stats:
            print(f"step {step.step:2d}  adapters {step.active_loras}  rows {sum(step.num_scheduled_tokens.values())}")
        for prompt, lora, req in zip(prompts, names, got, strict=True):
            alone = LLMEngine("tiny-random", enable_lora=lora is not None, max_lora_rank=16)
            want = alone.generate([prompt], greedy, lora_request=lora)[0].output_token_ids
            name = "base" if lora is None else lora.lora_name
            print(f"{name:4s} {prompt!r:22s} {req.output_token_ids}  same as alone: {req.output_token_ids == want}")


if __name__ == "__main__":
    _demo()
