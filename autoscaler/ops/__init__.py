"""Running in production: the journal, leader locks, metrics, health endpoints, the notice inbox
and the watched-provider decorator that times, fences and journals every cloud call."""
