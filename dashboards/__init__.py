"""Grafana dashboard, Prometheus rules and Alertmanager config for Governor, and the rules generator."""
