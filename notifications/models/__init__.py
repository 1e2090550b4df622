"""The notifications app's models: what people and tenants listen for, and what was sent to them."""

from notifications.models.deliveries import Delivery, Notification
from notifications.models.listeners import NotificationPreference, WebhookEndpoint

__all__ = ["Delivery", "Notification", "NotificationPreference", "WebhookEndpoint"]
