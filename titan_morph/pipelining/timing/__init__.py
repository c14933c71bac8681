"""Timing fixed orders: the ONE timing routine (``timeline``), its checked form with records and the
critical path (``simulate``), deadlock reports (``deadlock``) and the closed-form lower bounds on any
schedule (``bounds``). Imports only ``core``."""
