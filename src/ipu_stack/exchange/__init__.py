"""Exchange scheduling: turn one phase's transfers into a port-conflict-free chunk schedule.

See ``docs/exchange.md`` for the model, the algorithms and their guarantees.
"""

from ipu_stack.exchange.io import (
    load_instance,
    load_schedule,
    save_instance,
    save_schedule,
    schedule_command,
    verify_command,
)
from ipu_stack.exchange.memo import ScheduleMemo, ScheduleStore, phase_digest
from ipu_stack.exchange.model import (
    ExchangeError,
    Schedule,
    ScheduleError,
    Transfers,
    endpoint_lower_bound,
    table_bytes,
)
from ipu_stack.exchange.scheduler import reuse_schedule, schedule_exchange
from ipu_stack.exchange.verify import verify_schedule

__all__ = [
    "ExchangeError",
    "Schedule",
    "ScheduleError",
    "ScheduleMemo",
    "ScheduleStore",
    "Transfers",
    "endpoint_lower_bound",
    "load_instance",
    "load_schedule",
    "phase_digest",
    "reuse_schedule",
    "save_instance",
    "save_schedule",
    "schedule_command",
    "schedule_exchange",
    "table_bytes",
    "verify_command",
    "verify_schedule",
]
