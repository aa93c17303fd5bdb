"""Deterministic task generation: each task id maps to a seed, a query and a reference solution.

Kinds (cycled by index so every split has all of them): book the cheapest flight, book the
cheapest flight under a constraint (nonstop, an airline, a departure or arrival time), cancel one
of several bookings, and rebook onto another date. Queries name passengers, not ids, so the agent
has to look them up; the reference solution is what a careful agent would call.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from env_service.environments.flights.world import AIRLINES, AIRPORTS, DATES, Flight, Passenger, World

KINDS = ("book_cheapest", "book_constrained", "cancel", "rebook")
ORDER_REF = "$order:"  # reference placeholder: "$order:<passenger>:<flight>" = that active order's id


@dataclass(frozen=True)
class FlightTask:
    task_id: str
    kind: str
    query: str
    passenger_id: str
    preload: tuple[tuple[str, str], ...] = ()  # (passenger id, flight id) orders present at the start
    reference: tuple[tuple[str, dict[str, Any]], ...] = field(default_factory=tuple)
    target_flight: str | None = None


def _cheapest(flights: list[Flight], seats: Callable[[Flight], int]) -> Flight | None:
    """The unique cheapest flight with a seat, or None when there is none or a tie."""
    available = sorted((f for f in flights if seats(f) > 0), key=lambda f: f.price)
    if not available or (len(available) > 1 and available[0].price == available[1].price):
        return None
    return available[0]


def _where(code: str) -> str:
    return f"{AIRPORTS[code]} ({code})"


def _day(date: str) -> str:
    return f"June {int(date[8:])}, {date[:4]}"


class TaskGenerator:
    def __init__(self, world: World, seed: int) -> None:
        self.world, self.seed = world, seed

    def generate(self, split: str, index: int) -> FlightTask:
        rng = random.Random(f"flights:{self.seed}:{split}:{index}")
        kind = KINDS[index % len(KINDS)]
        task_id = f"{split}-{index:04d}"
        for _ in range(200):  # redraw until the sampled situation has a unique answer
            task = getattr(self, f"_{kind}")(rng, task_id)
            if task is not None:
                return task
        raise RuntimeError(f"could not generate flights task {task_id}; try another seed")

    # ------------------------------------------------------------ helpers

    def _draw(self, rng: random.Random) -> tuple[Passenger, tuple[str, str, str]]:
        passenger = rng.choice(list(self.world.passengers.values()))
        return passenger, rng.choice(self.world.route_keys())

    @staticmethod
    def _lookup(passenger: Passenger) -> tuple[str, dict[str, Any]]:
        return ("get_passenger", {"name": passenger.name})

    # ------------------------------------------------------------ kinds

    def _book_cheapest(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        target = _cheapest(self.world.route_flights(origin, destination, date), lambda f: f.seats)
        if target is None or target.price > passenger.balance:
            return None
        query = (f"Please book the cheapest available flight from {_where(origin)} to {_where(destination)} "
                 f"on {_day(date)} for {passenger.name}.")
        return FlightTask(task_id, "book_cheapest", query, passenger.passenger_id, reference=(
            self._lookup(passenger),
            ("search_flight", {"origin": origin, "destination": destination, "date": date}),
            ("book_ticket", {"passenger_id": passenger.passenger_id, "flight_id": target.flight_id}),
        ), target_flight=target.flight_id)

    def _book_constrained(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        flights = self.world.route_flights(origin, destination, date)
        constraints: list[tuple[str, Callable[[Flight], bool]]] = [("a nonstop", lambda f: f.stops == 0)]
        for code, airline in AIRLINES.items():
            constraints.append((f"a {airline}", lambda f, c=code: f.airline == c))
        for hour in (10, 13, 16):
            constraints.append((f"a flight departing at or after {hour}:00, the", lambda f, h=hour: f.depart >= f"{h:02d}:00"))
            constraints.append((f"a flight arriving before {hour + 4}:00, the",
                                lambda f, h=hour: f.arrive < f"{h + 4:02d}:00" and f.arrive > f.depart))
        label, allowed = rng.choice(constraints)
        overall = _cheapest(flights, lambda f: f.seats)
        target = _cheapest([f for f in flights if allowed(f)], lambda f: f.seats)
        if target is None or overall is None or target.flight_id == overall.flight_id:
            return None  # the constraint must matter
        if target.price > passenger.balance:
            return None
        if label.endswith("the"):
            wanted = f"{label} cheapest one with seats"
        else:
            wanted = f"the cheapest {label.removeprefix('a ')} flight with seats"
        query = (f"{passenger.name} needs to fly from {_where(origin)} to {_where(destination)} on {_day(date)}. "
                 f"Book {wanted}.")
        return FlightTask(task_id, "book_constrained", query, passenger.passenger_id, reference=(
            self._lookup(passenger),
            ("search_flight", {"origin": origin, "destination": destination, "date": date}),
            ("book_ticket", {"passenger_id": passenger.passenger_id, "flight_id": target.flight_id}),
        ), target_flight=target.flight_id)

    def _cancel(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        booked = [f for f in self.world.route_flights(origin, destination, date) if f.seats > 0]
        others = [k for k in self.world.route_keys() if k[:2] != (origin, destination)]
        decoy_key = rng.choice(others)
        decoys = [f for f in self.world.route_flights(*decoy_key) if f.seats > 0]
        if not booked or not decoys:
            return None
        target, decoy = rng.choice(booked), rng.choice(decoys)
        number = target.flight_id.split("-")[0]
        query = (f"{passenger.name} can no longer take flight {number} from {_where(origin)} to "
                 f"{_where(destination)} on {_day(date)}. Cancel that booking and keep their other bookings.")
        return FlightTask(task_id, "cancel", query, passenger.passenger_id,
                          preload=((passenger.passenger_id, target.flight_id), (passenger.passenger_id, decoy.flight_id)),
                          reference=(
                              self._lookup(passenger),
                              ("list_orders", {"passenger_id": passenger.passenger_id}),
                              ("cancel_order", {"order_id": f"{ORDER_REF}{passenger.passenger_id}:{target.flight_id}"}),
                          ), target_flight=target.flight_id)

    def _rebook(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        held = [f for f in self.world.route_flights(origin, destination, date) if f.seats > 0]
        new_date = rng.choice([d for d in DATES if d != date])
        target = _cheapest(self.world.route_flights(origin, destination, new_date), lambda f: f.seats)
        if not held or target is None:
            return None
        old = rng.choice(held)
        if target.price > passenger.balance + old.price:
            return None
        number = old.flight_id.split("-")[0]
        query = (f"{passenger.name} is booked on flight {number} from {_where(origin)} to {_where(destination)} "
                 f"on {_day(date)}. Move the trip to {_day(new_date)}: cancel that booking and book the "
                 f"cheapest available flight on the same route that day.")
        return FlightTask(task_id, "rebook", query, passenger.passenger_id,
                          preload=((passenger.passenger_id, old.flight_id),),
                          reference=(
                              self._lookup(passenger),
                              ("list_orders", {"passenger_id": passenger.passenger_id}),
                              ("search_flight", {"origin": origin, "destination": destination, "date": new_date}),
                              ("cancel_order", {"order_id": f"{ORDER_REF}{passenger.passenger_id}:{old.flight_id}"}),
                              ("book_ticket", {"passenger_id": passenger.passenger_id, "flight_id": target.flight_id}),
                          ), target_flight=target.flight_id)
