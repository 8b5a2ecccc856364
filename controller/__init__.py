"""The controller: observe -> decide -> apply as a trial -> judge -> keep or roll back; store, alerts, admin API."""
from controller.clients import EngineClient, EngineClientError, HttpClient, InProcessClient
from controller.counters import CountingSink, MetricsSink
from controller.loop import Controller
from controller.store import Store

__all__ = ["Controller", "CountingSink", "EngineClient", "EngineClientError", "HttpClient", "InProcessClient",
           "MetricsSink", "Store"]
