"""Pydantic models of the Redfish bodies about operations: Tasks, events, errors.

Why a module apart from :mod:`wire`: these are what the service says about
what it did (a Task and its messages, an event, an error answer), read by
:mod:`operations`, :mod:`transport` and the event stream, not the fabric's
resources; the same rules hold (declared properties only, no ``Oem``).
"""

from __future__ import annotations

from pydantic import Field

from driver.fabricclient.model import TaskState
from driver.fabricclient.wire import Link, _Wire


class Message(_Wire):
    message: str = Field(default="", alias="Message")
    message_id: str = Field(default="", alias="MessageId")


class Payload(_Wire):
    operation: str = Field(default="", alias="HttpOperation")
    target_uri: str = Field(default="", alias="TargetUri")
    json_body: str = Field(default="", alias="JsonBody")


class Task(_Wire):
    odata_id: str = Field(default="", alias="@odata.id")
    id: str = Field(default="", alias="Id")
    state: TaskState = Field(alias="TaskState")
    status: str | None = Field(default=None, alias="TaskStatus")
    monitor: str | None = Field(default=None, alias="TaskMonitor")
    messages: list[Message] = Field(default_factory=list, alias="Messages")
    payload: Payload | None = Field(default=None, alias="Payload")


class EventService(_Wire):
    sse_uri: str | None = Field(default=None, alias="ServerSentEventUri")


class EventRecord(_Wire):
    message_id: str = Field(default="", alias="MessageId")
    origin: Link | None = Field(default=None, alias="OriginOfCondition")


class Event(_Wire):
    """A Redfish ``Event`` from the EventService's SSE stream."""

    events: list[EventRecord] = Field(default_factory=list, alias="Events")


class ErrorInfo(_Wire):
    code: str = "Base.GeneralError"
    message: str = ""
    extended: list[Message] = Field(default_factory=list, alias="@Message.ExtendedInfo")


class ErrorBody(_Wire):
    error: ErrorInfo
