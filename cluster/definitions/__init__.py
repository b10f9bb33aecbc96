"""Definitions shared through the coordination service: the keys (keys), the shared table
(shared), how a change is applied to this node (apply) and the local mirror (mirror)."""
