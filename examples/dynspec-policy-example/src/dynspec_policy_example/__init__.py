"""A third-party sglang-dynspec policy: speculate while few requests wait for admission.

Also an observer: counts switches (a stand-in for exporting them somewhere).
"""

from pydantic import Field

from sglang_dynspec.hookspecs import hookimpl
from sglang_dynspec.policies.base import PolicyArgs, parse_args


class QueueArgs(PolicyArgs):
    max_waiting: int = Field(4, ge=0)
    max_bs: int = Field(32, ge=1)


class QueueAware:
    name = "queue_aware"

    def __init__(self, args):
        a = parse_args(QueueArgs, args, self.name)
        self.max_waiting, self.max_bs = a.max_waiting, a.max_bs

    def decide(self, x):
        return x.waiting <= self.max_waiting and x.decode_bs <= self.max_bs


SWITCHES = []


@hookimpl
def register_policies(register):
    register("queue_aware", QueueAware, "speculate while waiting <= max_waiting and bs <= max_bs")


@hookimpl
def dynspec_switch(record):
    SWITCHES.append(record.step)
