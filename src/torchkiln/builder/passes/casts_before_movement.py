"""Move a narrowing cast above the shuffle it reads, so it joins the kernel that makes the shuffled value.

The precision pass puts a cast back to half precision where a value leaves an fp32 region, at its reader; where
that reader takes a reshaped value (x.view(-1, n) before a matrix multiply), the cast reads the reshape's output
and becomes a pass of its own over memory. Casting and moving data commute exactly, so cast(shuffle(t)) becomes
shuffle(cast(t)), and the cast can join t's producer's kernel. Only narrowing float casts move (the shuffle then
moves fewer bytes, never more), and only where the shuffle's sole reader is the cast.
"""
from __future__ import annotations

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def _narrowing(cast: L.CastLayer) -> bool:
    src, dst = cast.inputs[0].dtype, cast.to_type
    return src.is_floating_point and dst.is_floating_point and dst.itemsize < src.itemsize


def casts_before_movement(network: Network, settings: BuildSettings) -> bool:
    changed = False
    while True:  # one sweep moves each cast above one shuffle; a chain of shuffles takes a sweep each
        readers = network.consumers()
        producer = {id(t): layer for layer in network.layers for t in layer.outputs}
        returned = {id(t) for t in network.outputs}
        moved = False
        for cast in list(network.layers):
            if not isinstance(cast, L.CastLayer) or not _narrowing(cast):
                continue
            shuffled = cast.inputs[0]
            shuffle = producer.get(id(shuffled))
            if not isinstance(shuffle, L.ShuffleLayer) or id(shuffled) in returned \
                    or len(readers.get(id(shuffled), [])) != 1:
                continue
            # cast(shuffle(t)) -> shuffle(cast(t)): the cast now makes the tensor the shuffle made, and the shuffle
            # makes the cast's, which its readers keep reading
            result = cast.outputs[0]
            cast.inputs, cast.outputs = [shuffle.inputs[0]], [shuffled]
            shuffle.inputs, shuffle.outputs = [shuffled, *shuffle.inputs[1:]], [result]
            shuffled.producer, result.producer = cast, shuffle
            network.move_before(cast, shuffle)
            moved = changed = True
        if not moved:
            return changed
        network.reinfer()
