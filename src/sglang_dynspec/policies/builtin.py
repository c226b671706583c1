"""The built-in policies, registered through the same hook third-party plugins use."""

from ..hookspecs import hookimpl
from .goodput import Goodput
from .simple import Always, Never, Random
from .threshold import Threshold


@hookimpl
def register_policies(register):
    register("always", Always, "speculate on every decode step (static EAGLE)")
    register("never", Never, "never speculate; plain decode + draft KV sync")
    register("threshold", Threshold, "speculate while decode batch size <= n (band, min_dwell)")
    register("random", Random, "seeded coin per step, for switch fuzzing (seed, p_on, period)")
    register("goodput", Goodput, "higher expected tokens/s from online acceptance and step-cost tables")
