"""The worker's side: hold until the chief's step reaches a target.

``waiter`` (``StepWaiter``, ``StepSource``), ``wait_state`` (what a wait
decides, without I/O), ``links`` (a waiter's subscription and registry entry),
and the shared parts of the asyncio waits (``aio_batch``, ``aio_subscription``).
"""
