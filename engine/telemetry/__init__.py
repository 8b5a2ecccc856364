"""The engine's own measurements: step records closed into Windows (recorder), Prometheus metrics, and the live view
the dashboard streams."""
