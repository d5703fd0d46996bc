"""Route and cluster bodies served by the name server, and the permission bits.

* ``GET_ROUTEINFO_BY_TOPIC`` (105) answers :class:`TopicRouteData`;
* ``GET_BROKER_CLUSTER_INFO`` (106) answers :class:`ClusterInfo`;
* ``GET_ALL_TOPIC_LIST_FROM_NAMESERVER`` (206) and friends answer :class:`TopicList`.

Property names follow ``remoting/.../protocol/route/*.java`` and ``body/ClusterInfo.java``.
``BrokerData.brokerAddrs`` is a Java ``HashMap<Long, String>`` (broker id to address; id 0
is the master), which fastjson writes with bare keys (``{0:"host:port"}``); we write the
quoted form ``{"0":"host:port"}``, which all three observed clients accepted
(``reference/wire-facts.md``). ``TopicRouteData.topicQueueMappingByBroker`` (static topics)
is not modelled: it is ignored when read and never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Self

from protocol.bodies._fields import INT64, Fields, JsonBody, as_int, as_text, as_texts

# ``common/.../constant/PermName.java``: bits of a topic's ``perm``.
PERM_PRIORITY: Final = 0x8
PERM_READ: Final = 0x4
PERM_WRITE: Final = 0x2
PERM_INHERIT: Final = 0x1
#: The default permission of a topic: readable and writeable.
PERM_READ_WRITE: Final = PERM_READ | PERM_WRITE
#: ``MixAll.MASTER_ID``: the broker id of a master in ``brokerAddrs``.
MASTER_ID: Final = 0


def is_readable(perm: int) -> bool:
    """``PermName.isReadable``."""
    return perm & PERM_READ == PERM_READ


def is_writeable(perm: int) -> bool:
    """``PermName.isWriteable``."""
    return perm & PERM_WRITE == PERM_WRITE


def is_inherited(perm: int) -> bool:
    """``PermName.isInherited``."""
    return perm & PERM_INHERIT == PERM_INHERIT


def perm_to_string(perm: int) -> str:
    """``PermName.perm2String``: ``"RW-"`` for 6, ``"---"`` for 0 (X is inherit)."""
    return "".join(
        flag if test(perm) else "-"
        for flag, test in (("R", is_readable), ("W", is_writeable), ("X", is_inherited))
    )


@dataclass(frozen=True, slots=True)
class QueueData(JsonBody):
    """How many queues a topic has on one broker, and the broker's permission for it."""

    broker_name: str
    read_queue_nums: int = 0
    write_queue_nums: int = 0
    perm: int = PERM_READ_WRITE
    topic_sys_flag: int = 0

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            broker_name=f.text("brokerName"),
            read_queue_nums=f.int32("readQueueNums"),
            write_queue_nums=f.int32("writeQueueNums"),
            perm=f.int32("perm", PERM_READ_WRITE),
            topic_sys_flag=f.int32("topicSysFlag"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "brokerName": self.broker_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicSysFlag": self.topic_sys_flag,
        }


@dataclass(frozen=True, slots=True)
class BrokerData(JsonBody):
    """One broker group (a master and its slaves) and the cluster it belongs to.

    ``enable_acting_master`` and ``zone_name`` are written only when set, so the default
    encoding has exactly the shape the observed clients accepted.
    """

    cluster: str
    broker_name: str
    broker_addrs: Mapping[int, str] = field(default_factory=dict)
    enable_acting_master: bool = False
    zone_name: str | None = None

    @property
    def master_addr(self) -> str | None:
        """The master's address (broker id 0), if it is registered."""
        return self.broker_addrs.get(MASTER_ID)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object; ``brokerAddrs`` keys may be bare or quoted."""
        f = Fields(obj, path)
        addrs = {
            as_int(key, at, INT64): as_text(addr, at) for key, addr, at in f.entries("brokerAddrs")
        }
        return cls(
            cluster=f.text("cluster"),
            broker_name=f.text("brokerName"),
            broker_addrs=addrs,
            enable_acting_master=f.boolean("enableActingMaster"),
            zone_name=f.opt_text("zoneName"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object, broker ids as quoted keys."""
        obj: dict[str, object] = {
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "brokerAddrs": {str(bid): addr for bid, addr in self.broker_addrs.items()},
        }
        if self.enable_acting_master:
            obj["enableActingMaster"] = True
        if self.zone_name is not None:
            obj["zoneName"] = self.zone_name
        return obj


@dataclass(frozen=True, slots=True)
class TopicRouteData(JsonBody):
    """Where a topic lives: its queues per broker and the brokers' addresses.

    Encodes to exactly ``{"orderTopicConf":null,"queueDatas":[…],"brokerDatas":[…],
    "filterServerTable":{}}`` for a topic without order configuration or filter servers.
    """

    queue_datas: tuple[QueueData, ...] = ()
    broker_datas: tuple[BrokerData, ...] = ()
    order_topic_conf: str | None = None
    filter_server_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(
            queue_datas=tuple(QueueData.from_obj(item, at) for item, at in f.items("queueDatas")),
            broker_datas=tuple(
                BrokerData.from_obj(item, at) for item, at in f.items("brokerDatas")
            ),
            order_topic_conf=f.opt_text("orderTopicConf"),
            filter_server_table=_string_lists(f, "filterServerTable"),
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object, in the field order the observed clients accepted."""
        return {
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [queue.to_obj() for queue in self.queue_datas],
            "brokerDatas": [broker.to_obj() for broker in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
        }


def _string_lists(f: Fields, name: str) -> dict[str, tuple[str, ...]]:
    """A ``Map<String, List<String>>`` (or ``Set``) field."""
    return {key: as_texts(value, at) for key, value, at in f.entries(name)}


@dataclass(frozen=True, slots=True)
class ClusterInfo(JsonBody):
    """``GET_BROKER_CLUSTER_INFO``: every broker group, and the groups of each cluster."""

    broker_addr_table: Mapping[str, BrokerData] = field(default_factory=dict)
    cluster_addr_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        brokers = {
            name: BrokerData.from_obj(value, at) for name, value, at in f.entries("brokerAddrTable")
        }
        return cls(
            broker_addr_table=brokers, cluster_addr_table=_string_lists(f, "clusterAddrTable")
        )

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {
            "brokerAddrTable": {k: v.to_obj() for k, v in self.broker_addr_table.items()},
            "clusterAddrTable": {k: list(v) for k, v in self.cluster_addr_table.items()},
        }


@dataclass(frozen=True, slots=True)
class TopicList(JsonBody):
    """A list of topic names; ``brokerAddr`` is set by some admin queries only."""

    topic_list: tuple[str, ...] = ()
    broker_addr: str | None = None

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object."""
        f = Fields(obj, path)
        return cls(topic_list=f.texts("topicList"), broker_addr=f.opt_text("brokerAddr"))

    def to_obj(self) -> dict[str, object]:
        """The JSON object (``brokerAddr`` only when set, as fastjson omits nulls)."""
        obj: dict[str, object] = {"topicList": list(self.topic_list)}
        if self.broker_addr is not None:
            obj["brokerAddr"] = self.broker_addr
        return obj
