"""``PushConsumer``: messages are delivered to a listener; the consumer fetches, settles,
retries and commits (RocketMQ's ``DefaultMQPushConsumer`` / RocketMQ 5 ``PushConsumer``).

Task ownership: the consumer's ``async with`` owns a client instance (connections, routes,
heartbeats) whose task group holds two task groups of ours — the *fetchers* (the mode's
engine: receive or rebalance/pull loops) and the *consumers* (one task per message, or per
queue/batch when orderly). Shutdown on leaving the block:

1. stop fetching (cancel the fetchers); queued messages will not reach the listener;
2. let listener calls in flight finish and be settled (ack / send-back / offset), up to
   ``shutdown_timeout``, then cancel what is left;
3. pop: cached messages that were never consumed were given back in step 2 (their invisible
   time set to the minimum, so they are redelivered at once); pull: persist the offsets (the
   smallest unfinished one per queue, so nothing unconsumed is skipped) and unlock the queues;
4. unregister the group from the brokers and close the connections.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.abc
import structlog

from client.config import ClientConfig
from client.errors import ClientClosedError, single_error
from client.filters import FilterExpression, as_filters
from client.instance import ClientInstance, open_instance
from client.push.pop_mode import PopEngine
from client.push.pull_mode import PullEngine
from client.push.runtime import PushOptions, Runtime
from client.push.types import Listener, PushStatistics
from client.simple_consumer import subscription_data, verify_filters
from protocol.bodies.consumer import MessageQueue
from protocol.bodies.heartbeat import ConsumeFromWhere, ConsumerData, ConsumeType, MessageModel
from protocol.naming import retry_topic, validate_group, validate_topic

_log = structlog.get_logger("trimq.client.push")


class PushConsumer:
    """Delivers messages to ``listener`` while the ``async with`` block runs.

    Args:
        config: connection settings. With the default instance name a consumer gets a
            unique one (as Java's ``changeInstanceNameToPID``), so several consumers of one
            group in one process are distinct group members (one leaving does not
            unregister the others).
        group: the consumer group.
        subscription: topic → filter: a tag expression (``"*"``, ``"a || b"``) or a
            :class:`~client.filters.FilterExpression` (``FilterExpression.sql("n > 5")``).
            SQL92 expressions are parsed here (``ValueError``) and checked with the topic's
            brokers on entering the block (``SubscriptionRefusedError``).
        listener: ``(ReceivedMessage) -> ConsumeResult``, sync (run in worker threads) or
            async (run as tasks); anything but ``SUCCESS``, or an exception, is a failure.
        mode: ``"pop"`` (the broker balances; RocketMQ 5) or ``"pull"`` (client-side
            rebalance with offsets; RocketMQ 4).
        orderly: consume each queue's messages one at a time, in order.
        consume_concurrency: listener calls at most running at once (Java's 20 threads).
        max_cache_messages, max_cache_bytes: fetching pauses at these many cached messages
            (never exceeded) or bytes (RocketMQ 5: 1024 and 64 MiB).
        consume_timeout: seconds a listener call may run (Java: 15 min); past it the
            message counts as failed and is retried, its late result ignored.
        max_reconsume_times: retries before a message is dead-lettered (16). Pull mode sends
            it with the send-back; orderly consumers enforce it themselves.
        consume_from: where a group without a committed position starts: ``"last"`` or
            ``"first"``.
        invisible_duration: pop mode: seconds a popped message stays invisible (default
            ``consume_timeout`` + 10 s).
        pull_batch_size: messages per pull / pop (32).
        long_poll: seconds a fetch may be held by the broker (pull 15, pop 20).
        suspend_interval: orderly: seconds before a failed message is retried.
        shutdown_timeout: seconds in-flight listener calls get to finish on exit.
        send_back_delay_level: pull mode: delay level of a failed message's retry
            (0 = the broker's ``3 + reconsume times``: 10 s, 30 s, 1 min …).
        retry_backoff_initial, retry_backoff_max: pop mode: a failed message comes back
            after ``initial * 2**(attempt-1)`` seconds, at most ``max``.
        rebalance_interval, persist_interval: pull mode timers (20 s, 5 s).
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        group: str,
        subscription: Mapping[str, str | FilterExpression],
        listener: Listener,
        mode: str = "pop",
        orderly: bool = False,
        **options: Any,
    ) -> None:
        validate_group(group)
        if not subscription:
            raise ValueError("a push consumer needs at least one subscribed topic")
        for topic in subscription:
            validate_topic(topic)
        self.options = PushOptions(mode=mode, orderly=orderly, **options)
        config = config or ClientConfig()
        if config.instance_name == "DEFAULT":
            config = dataclasses.replace(config, instance_name=f"{time.monotonic_ns()}")
        self.config = config
        self.group = group
        self.subscription = as_filters(subscription)
        self.listener = listener
        self._runtime: Runtime | None = None
        self._stack: AsyncExitStack | None = None
        self._instance: ClientInstance | None = None
        self._engine: PopEngine | PullEngine | None = None
        self._fetchers: anyio.CancelScope | None = None
        self._consumers: anyio.abc.TaskGroup | None = None

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> PushConsumer:
        # What starting raised, not the instance task group's wrapping of it.
        with single_error():
            async with AsyncExitStack() as stack:  # unwinds if starting fails
                instance, tg = await stack.enter_async_context(open_instance(self.config))
                instance.consumer_data = self._consumer_data
                await instance.prefetch_routes(self.subscription)  # engines retry missing ones
                # Before registering: a refused filter must fail here, not as a consumer whose
                # fetch loops only log it (Java checks with checkClientInBroker at start).
                await verify_filters(instance, self.group, self.subscription)
                await instance.heartbeat()
                runtime = Runtime(self.listener, self.options)
                consumers = await stack.enter_async_context(anyio.create_task_group())
                engine: PopEngine | PullEngine
                if self.options.mode == "pop":
                    engine = PopEngine(instance, self.group, self.subscription, runtime, consumers)
                else:
                    engine = PullEngine(instance, self.group, self.subscription, runtime, consumers)
                    instance.on_rebalance = self._on_rebalance
                    instance.on_reset_offset = self._on_reset_offset
                self._fetchers = anyio.CancelScope()
                tg.start_soon(self._run_fetchers, engine, self._fetchers)
                self._stack, self._instance, self._runtime = stack.pop_all(), instance, runtime
        self._engine, self._consumers = engine, consumers
        return self

    @staticmethod
    async def _run_fetchers(engine: PopEngine | PullEngine, scope: anyio.CancelScope) -> None:
        with scope:
            await engine.run()

    def _on_reset_offset(self, group: str, topic: str, table: dict[MessageQueue, int]) -> None:
        if group == self.group and isinstance(self._engine, PullEngine):
            self._engine.reset_offsets(topic, table)

    def _on_rebalance(self, group: str) -> None:
        if group == self.group and isinstance(self._engine, PullEngine):
            self._engine.request_rebalance()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, instance, runtime = self._stack, self._instance, self._runtime
        engine, consumers, fetchers = self._engine, self._consumers, self._fetchers
        # The runtime stays: statistics() reports the final counts after the block.
        self._stack = self._instance = self._engine = None
        if stack is None or instance is None or runtime is None or consumers is None:
            return
        with anyio.CancelScope(shield=True):
            runtime.closing = True
            if fetchers is not None:
                fetchers.cancel()
            if not await runtime.wait_settled(self.options.shutdown_timeout):
                _log.warning("shutdown timeout: abandoning listener calls", left=runtime.tasks)
            consumers.cancel_scope.cancel()
            with anyio.move_on_after(self.config.request_timeout * 2):
                if isinstance(engine, PullEngine):
                    await engine.close()
                await instance.unregister(consumer_group=self.group)
        await stack.__aexit__(exc_type, exc, tb)

    # ------------------------------------------------------------------ introspection
    def _consumer_data(self) -> list[ConsumerData]:
        subs = dict(self.subscription)
        if self.options.mode == "pull":
            # As Java: also subscribe to the group's retry topic, so sent-back messages
            # come back to the group.
            subs.setdefault(retry_topic(self.group), FilterExpression())
        return [
            ConsumerData(
                group_name=self.group,
                consume_type=ConsumeType.CONSUME_POP
                if self.options.mode == "pop"
                else ConsumeType.CONSUME_PASSIVELY,
                message_model=MessageModel.CLUSTERING,
                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
                if self.options.consume_from == "first"
                else ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
                subscription_data_set=tuple(
                    subscription_data(t, e) for t, e in sorted(subs.items())
                ),
            )
        ]

    @property
    def instance(self) -> ClientInstance:
        """The running client core.

        Raises:
            ClientClosedError: outside ``async with``.
        """
        if self._instance is None:
            raise ClientClosedError("the consumer is not running: use 'async with'")
        return self._instance

    def statistics(self) -> PushStatistics:
        """Cache, concurrency and outcome counters: live while running, the final ones
        after the block, zeros before it."""
        if self._runtime is None:
            return PushStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        return self._runtime.statistics()

    async def run_until_cancelled(self) -> None:
        """Sleep while the consumer works, until the caller is cancelled (a service's
        main task: ``async with PushConsumer(...) as c: await c.run_until_cancelled()``).

        Raises:
            ClientClosedError: outside ``async with``.
        """
        _ = self.instance
        await anyio.sleep_forever()

    @property
    def assigned_queues(self) -> list[MessageQueue]:
        """Pull mode: the queues this consumer owns now (sorted); pop mode: empty."""
        if isinstance(self._engine, PullEngine):
            return sorted(self._engine.queues)
        return []
