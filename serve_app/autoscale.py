"""The import path that deploy configs name for the headroom policy
(``policy_function: serve_app.autoscale:HeadroomPolicy``); it lives in serve_app.control.policy."""

from serve_app.control.policy import HeadroomPolicy, headroom_policy

__all__ = ["HeadroomPolicy", "headroom_policy"]
