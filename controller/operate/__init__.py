"""What operators and their tools reach: the admin API, Alertmanager's webhook intake, retention of old records, and
the leader lease a standby controller waits on."""
