"""Bring your own conv net: :func:`to_supernet` turns an ordinary ``nn.Module`` into a
supernet-ready copy, each layer as its adapter in :mod:`espn.layers` says. What is converted,
what is refused and how units are formed: docs/architectures.md."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
from torch import Tensor, nn

from espn.layers import ConvertError, Placement, adapter_for, source_names
from espn.layers.base import call_hooked
from espn.layers.functional import FunctionalRead
from espn.layers.layernorm import channel_layer_norm
from espn.layers.parameters import TaskParameters
from espn.models.convert_checks import check_flops_counted, check_task_cut, module_flops
from espn.models.convert_tokens import check_stream_sources, replace_attention, token_outputs
from espn.models.coupling import Coupling, Group, couple
from espn.models.heads import output_layers
from espn.models.probe import adapter, dependency_graph, successors
from espn.models.registry import MODELS, ModelSpec

__all__ = ["ConvertError", "load_entry_point_models", "register_converted", "to_supernet"]


def _check_modules(model: nn.Module) -> tuple[dict[str, nn.Module], dict[str, nn.Parameter]]:
    """Named modules of a layer type espn has an adapter for, and the parameters held by
    any other module (by qualified name; refused unless they join a token stream, see
    :func:`_stream_parameters`)."""
    found: dict[str, nn.Module] = {}
    bare: dict[str, nn.Parameter] = {}
    seen: dict[int, str] = {}
    attention: list[str] = []
    for name, m in model.named_modules(remove_duplicate=False):
        if any(name.startswith(f"{a}.") for a in attention):
            continue  # the projections of a MultiheadAttention: converted with it
        adapter = adapter_for(m)
        if adapter is not None and adapter.role == "attention":
            attention.append(name)
        if adapter is not None:
            adapter.check(name, m)
            if id(m) in seen:
                raise ConvertError(
                    f"module {seen[id(m)]!r} is used again as {name!r}; shared layers are "
                    "not supported (each task mask needs one module per layer)"
                )
            seen[id(m)] = name
            found[name] = m
        elif type(m).__module__.startswith("torch.") and any(True for _ in m.parameters(False)):
            raise _refuse_parameter(model, name)  # a torch layer type without an adapter
        else:  # a module of the user's own: its parameters may join a token stream
            for leaf, p in m.named_parameters(recurse=False):
                bare[f"{name}.{leaf}" if name else leaf] = p
    owner: dict[int, str] = {}
    for name, m in found.items():
        for p in m.parameters():
            if id(p) in owner:
                raise ConvertError(
                    f"module {name!r} shares a parameter with {owner[id(p)]!r} (tied weights); "
                    "espn masks, freezes and prunes each layer's weights on their own, so tied "
                    "layers would be untied; give each layer its own parameters"
                )
            owner[id(p)] = name
    return found, bare


def _refuse_parameter(model: nn.Module, owner: str) -> ConvertError:
    """The refusal of module ``owner``, whose parameters espn cannot express."""
    kind = type(model.get_submodule(owner)).__name__
    return ConvertError(
        f"module {owner!r} is a {kind} with parameters; the converter supports "
        f"{source_names()} and nn.TransformerEncoder(Layer) (plus parameter-free modules, and "
        "bare per-feature parameters: a class token, position embeddings, a layer scale), and "
        "self-attention written with a qkv and an output projection"
    )


def _check_calls(
    model: nn.Module, example_input: Tensor, modules: dict[str, nn.Module]
) -> dict[str, nn.Module]:
    """Refuse a layer that ``forward`` calls more than once on the example input (its masks,
    unit groups and FLOPs are per layer, and a second call would need its own), or never. A
    layer not called is first put in a :class:`FunctionalRead` (named ``NAME.layer`` from
    then on), which calls it where ``forward`` passes its weights to a function (Swin's
    ``F.linear(x, self.qkv.weight, self.qkv.bias)``). Returns ``modules`` so renamed."""
    calls = _calls(model, example_input, modules)
    read = [n for n, k in calls.items() if k == 0]
    for name in read:
        model.set_submodule(name, FunctionalRead(name, modules[name]))
    names = {f"{n}.layer" if n in read else n: n for n in modules}
    modules = {key: modules[n] for key, n in names.items()}
    for key, k in (_calls(model, example_input, modules) if read else calls).items():
        if k == 0:
            raise ConvertError(
                f"module {names[key]!r} is not used by forward() on the example input"
            )
        if k > 1:
            raise ConvertError(
                f"module {names[key]!r} ({k} times) is called more than once by forward(); a "
                "layer called again is a shared layer, not supported (each call would need its "
                "own task masks and FLOPs): use one module per call"
            )
    return modules


def _calls(model: nn.Module, example: Tensor, modules: dict[str, nn.Module]) -> dict[str, int]:
    """How many times ``forward`` calls each of ``modules`` on ``example``."""
    calls = dict.fromkeys(modules, 0)

    def count(name: str) -> Callable[..., None]:
        def hook(*_: object) -> None:
            calls[name] += 1

        return hook

    hooks = [m.register_forward_pre_hook(count(n)) for n, m in modules.items()]
    with torch.enable_grad():  # without, nn.TransformerEncoderLayer calls none of its layers
        call_hooked(model, hooks, example)
    return calls


def _torch_class(m: nn.Module) -> type[nn.Module]:
    """The torch layer class ``m`` is or subclasses (the one its adapter stands for)."""
    return next(t for t in type(m).__mro__ if t.__module__.startswith("torch.nn"))


def _same(a: object, b: object) -> bool:
    """Whether two module outputs (tensors, or tuples of them) are equal bit for bit."""
    pairs = zip(*(x if isinstance(x, tuple) else (x,) for x in (a, b)), strict=False)
    return all(x is y or (isinstance(x, Tensor) and torch.equal(x, y)) for x, y in pairs)


def _plain_layers(model: nn.Module, example: Tensor) -> None:
    """Make every layer whose class replaces its torch class's ``forward`` compute as its torch
    class, in place (timm's ``BatchNormAct2d`` as an ``nn.Sequential`` of it and its children,
    ``LayerNorm2d`` by :func:`~espn.layers.layernorm.channel_layer_norm`), or refuse it."""
    subclassed = {
        n: m
        for n, m in model.named_modules()
        if adapter_for(m) is not None and type(m).forward is not _torch_class(m).forward
    }
    split: dict[str, nn.Sequential] = {}
    differs: list[str] = []

    def plain(m: nn.Module) -> nn.Module:
        layer = copy.copy(m)
        layer.__class__ = _torch_class(m)
        layer._modules = {}
        return layer

    def runs_as(layer: Callable[..., object], inp: tuple[object, ...], out: object) -> bool:
        try:
            return _same(layer(*inp), out)
        except Exception:  # it cannot even run on this input
            return False

    def compare(name: str) -> Callable[..., None]:
        def hook(m: nn.Module, inp: tuple[object, ...], out: object) -> None:
            if runs_as(partial(_torch_class(m).forward, m), inp, out):
                return
            seq = nn.Sequential(plain(m), *m.children())
            if isinstance(m, nn.LayerNorm) and len(seq) == 1:
                seq = channel_layer_norm(plain(m))
            if len(seq) > 1 and runs_as(seq, inp, out):
                split[name] = seq
            else:
                differs.append(name)

        return hook

    hooks = [m.register_forward_hook(compare(n)) for n, m in subclassed.items()]
    with torch.no_grad():
        call_hooked(model, hooks, example)
    if differs:
        m = subclassed[differs[0]]
        torch_name = f"nn.{_torch_class(m).__name__}"
        raise ConvertError(
            f"module {differs[0]!r} is a {type(m).__name__}, a {torch_name} whose forward() "
            f"computes something else than {torch_name}'s (such as a padding of its own); espn "
            f"converts it as {torch_name}, so it is not supported"
        )
    for name, seq in split.items():
        model.set_submodule(name, seq)


def to_supernet(
    model: nn.Module,
    example_input: Tensor,
    multi_head: bool = True,
    task_affine: bool = False,
) -> nn.Module:
    """A supernet-ready copy of ``model`` (see the module docstring); ``model`` is untouched.

    ``example_input`` is a small batch of inputs used to trace the network (float32, or int64
    token ids into an ``nn.Embedding``). The output layers become task heads: a
    :class:`TaskHead` per task with ``multi_head``, else a shared masked layer (followed by a
    per-task bias with ``task_affine``, which also gives gates a per-task scale and shift).
    Weights, BatchNorm parameters and statistics and the classifier are copied, so that the
    result computes what ``model`` computes (in eval mode) until the first task begins, which
    resets BatchNorms and heads.
    """
    if not example_input.is_floating_point() and not any(
        isinstance(m, nn.Embedding) for m in model.modules()
    ):
        raise ConvertError(
            f"example_input: {str(example_input.dtype).removeprefix('torch.')} inputs are "
            "token ids, but the model has no nn.Embedding to read them; give float32 inputs"
        )
    model = copy.deepcopy(model).eval()
    measured = module_flops(model, example_input)
    _plain_layers(model, example_input)
    replace_attention(model, example_input)
    modules, bare = _check_modules(model)
    modules = _check_calls(model, example_input, modules)
    graph = dependency_graph(model, example_input)
    successor = successors(graph, modules)
    heads = output_layers(model, example_input, graph, modules)
    coupling = couple(model, example_input, modules, bare, graph)
    places, adopted = _placements(
        model, example_input, modules, bare, successor, heads, coupling, multi_head, task_affine
    )
    concats = _concatenations(coupling.groups, places, modules)
    if concats:
        model.unit_concats = concats  # type: ignore[assignment]  # see Supernet.concats
    refused = [n for n in bare if n not in adopted]
    if refused:
        raise _refuse_parameter(model, refused[0].rpartition(".")[0])
    linears = sorted(n for n, p in places.items() if p.gated and adapter(modules[n]).token_outputs)
    for name in token_outputs(model, example_input, linears):
        places[name].tokens = True
    for name, m in modules.items():
        model.set_submodule(name, adapter(m).convert(m, places[name]))
    if adopted:
        adopted = {n: adopted[n] for n in bare if n in adopted}  # the model's order
        _hold_parameters(model, bare, adopted)
    del modules, successor, graph  # the replaced layers, freed before the checks copy the model
    check_flops_counted(measured, model, example_input)
    check_task_cut(model, example_input)
    return model


def _placements(
    model: nn.Module,
    example: Tensor,
    modules: dict[str, nn.Module],
    bare: dict[str, nn.Parameter],
    successor: dict[str, nn.Module | None],
    heads: list[str],
    coupling: Coupling,
    multi_head: bool,
    task_affine: bool,
) -> tuple[dict[str, Placement], dict[str, str | None]]:
    """Where each layer goes (see :func:`_place`), and the bare parameters the unit groups
    adopt (with their group)."""
    places = {
        name: Placement(
            name,
            in_unit=coupling.repeats.get(name, 1),
            head=name in heads,  # output_layers checked it is a layer that can be one
            multi_head=multi_head,
            task_affine=task_affine,
            scales=name in coupling.scales,
        )
        for name in modules
    }
    adopted: dict[str, str | None] = {}
    for g in coupling.groups:
        if not set(heads) & set(g.producers):  # the classes: never pruned
            adopted |= _place(model, example, g, places, modules, bare, successor)
    return places, adopted


def _place(
    model: nn.Module,
    example: Tensor,
    g: Group,
    places: dict[str, Placement],
    modules: dict[str, nn.Module],
    bare: dict[str, nn.Parameter],
    successor: dict[str, nn.Module | None],
) -> dict[str, str | None]:
    """Name unit group ``g`` after its first producer and place its layers in it (gating the
    producers whose dead channels nothing else silences); returns the bare parameters it
    adopts, with its name (None: a group kept whole, whose parameters are never cut)."""
    if not g.producers:
        raise ConvertError(
            f"the channels of {(g.attentions + g.norms + g.consumers)[0]!r} come from no "
            "layer (the model input?); start the network with a conv or linear layer"
        )
    order = list(modules)
    g.name = min(g.producers, key=order.index)
    for name in g.consumers + g.attentions:
        places[name].in_group = g.name
    for name, size in g.in_unit.items():
        places[name].in_unit = size
    for name in g.norms:
        if name not in g.slices:  # a norm over a concatenation: see _concatenations
            places[name].norm_group, places[name].norm_unit = g.name, g.norm_unit[name]
    for name in g.tokens:
        if places[name].task_affine:
            raise ConvertError(
                f"layer {name!r} is applied across the token axis (an MLP-Mixer's token "
                "mixing), where task_affine's per-task shifts would write pruned channels: use "
                "task_affine=False"
            )
        places[name].rows = g.name
    stream = any(adapter(modules[n]).tokens for n in g.norms + g.attentions)
    if stream or g.params:
        writers = g.producers + g.norms + g.attentions + g.tokens
        readers = g.consumers + g.norms + g.attentions
        params = [bare[n] for n in g.params]
        check_stream_sources(model, example, g.name, writers, readers, params)
    for name in g.producers:
        place = places[name]
        place.out_group, place.out_unit = g.name, g.out_unit[name]
        if g.norms and place.scales:
            continue  # a feature scale: its dead channels multiply zero features
        # a bias right before a BatchNorm is absorbed by it; any other bias (before a
        # GroupNorm too: it shifts channels of a group differently) becomes the shift of a
        # gate, and a group without norms gets its saliency from gates
        after = successor[name]
        absorbed = after is not None and getattr(adapter_for(after), "absorbs_bias", False)
        bias = getattr(modules[name], "bias", None) is not None
        if not g.norms or (bias and not absorbed):
            place.gated = True
    return {name: None if g.fixed else g.name for name in g.params + g.scale_params}


def _concatenations(
    groups: list[Group], places: dict[str, Placement], modules: dict[str, nn.Module]
) -> dict[str, tuple[str, ...]]:
    """Place the layers and norms reading concatenated feature maps (``torch.cat``): a
    layer's input side is the concatenation of its members' unit groups, a norm becomes one
    norm per member; refused unless the members' channels, in order, are all the reader's
    inputs, each member in units of one width. Returns the concatenations by name."""
    reads: dict[str, list[tuple[int, int, Group]]] = {}
    for g in groups:
        for name, (start, unit) in g.slices.items():
            reads.setdefault(name, []).append((start, unit, g))
    concats: dict[str, tuple[str, ...]] = {}
    for name, parts in reads.items():
        parts.sort(key=lambda part: part[0])
        m = modules[name]
        norm = adapter(m).role == "norm"
        starts = [start for start, _, _ in parts]
        ends = [start + g.size * unit for start, unit, g in parts]
        width = adapter(m).width(m, norm)
        if starts != [0, *ends[:-1]] or ends[-1] != width:
            raise ConvertError(
                f"layer {name!r} reads a concatenation of which {width - sum(ends) + sum(starts)} "
                f"of its {width} channels come from no layer (the model input or a bare "
                "parameter); supported: torch.cat of conv or linear layers' outputs"
            )
        units = sorted({unit for _, unit, _ in parts})
        if len(units) != 1:
            raise ConvertError(
                f"layer {name!r} reads a concatenation of feature maps pruned in units of "
                f"{units[0]} and {units[-1]} channels (grouped convs or GroupNorms); supported: "
                "concatenations of feature maps pruned in units of one size"
            )
        members = tuple(g.name for _, _, g in parts)
        concat = f"cat({','.join(members)})"
        concats[concat] = members
        place = places[name]
        if norm:
            place.norm_group, place.norm_unit = concat, units[0]
            place.concat = tuple((g.name, g.size * unit) for _, unit, g in parts)
        else:
            place.in_group, place.in_unit = concat, units[0]
    return concats


def _hold_parameters(
    model: nn.Module, bare: dict[str, nn.Parameter], adopted: dict[str, str | None]
) -> None:
    """Make the adopted bare parameters per-task state: one :class:`TaskParameters` on the
    model registers them (the model keeps reading them where they are)."""
    if isinstance(model, nn.Sequential | nn.ModuleList | nn.ModuleDict):
        raise ConvertError(
            f"parameter {next(iter(adopted))!r} is held in a {type(model).__name__}, whose "
            "forward would call a module added to it; hold it on a module of your own"
        )
    name = "espn_task_parameters"
    while hasattr(model, name):
        name = f"_{name}"
    params = {n: bare[n] for n in adopted}
    model.add_module(name, TaskParameters(params, list(adopted.values())))


def register_converted(
    name: str, build: Callable[[ModelSpec], nn.Module], example_batch: int = 2
) -> None:
    """Register ``build(spec) -> plain nn.Module`` as model ``name``, converted on the fly.

    Example: ``register_converted("vgg11-bn", lambda s: torchvision.models.vgg11_bn(
    num_classes=s.n_classes))`` makes ``make_config(model="vgg11-bn", ...)`` work.
    """

    def factory(spec: ModelSpec) -> nn.Module:
        plain = build(spec)
        example = torch.zeros(example_batch, *spec.input_shape)
        return to_supernet(plain, example, spec.multi_head, spec.task_affine)

    factory.__doc__ = f"{name}: converted from a plain torch model by espn.models.convert"
    MODELS.register(name)(factory)


def load_entry_point_models() -> list[str]:
    """Register the models other packages expose in the ``espn.models`` entry-point group.

    Each entry point ``NAME = "pkg.module:factory"`` names a factory ``factory(spec)`` that
    returns a supernet-ready module (for instance through :func:`to_supernet`); it is imported
    only when the model is built. Returns the names registered.
    """
    from importlib.metadata import entry_points

    added = []
    for ep in entry_points(group="espn.models"):
        if ep.name in MODELS:
            continue

        def factory(spec: ModelSpec, ep: object = ep) -> nn.Module:
            return ep.load()(spec)  # type: ignore[attr-defined]

        factory.__doc__ = f"{ep.name}: from the entry point {ep.value}"
        MODELS.register(ep.name)(factory)
        added.append(ep.name)
    return added
