"""`flights`: a tool-API booking desk (search, book, cancel, passengers, orders) with hidden preconditions."""

from env_service.environments.flights.env import FlightsEnvironment, FlightsInstance

__all__ = ["FlightsEnvironment", "FlightsInstance"]
