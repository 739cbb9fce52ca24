"""Notifications for a single machine without Alertmanager: Slack incoming webhooks.

See ``monitor.notify.slack`` for the API (``SlackNotifier``).
"""
