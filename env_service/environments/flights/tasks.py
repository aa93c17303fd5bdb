"""Deterministic task generation: each task id maps to a seed, a query and a reference solution.

Tasks come in three tiers of difficulty (kinds cycled by index so every split has all of a tier's kinds):
- tier 1, one call, answered in text: the cheapest fare of a route and date, a passenger's travel
  credit, a passenger's id. Graded by the answer (`FlightTask.answer`), the state must stay unchanged;
- tier 2, two calls, ids given: book the cheapest flight for a passenger id (search, book), cancel a
  passenger id's booking (list orders, cancel);
- tier 3, three to five calls (the environment's original kinds): book the cheapest flight, book the
  cheapest flight under a constraint (nonstop, an airline, a departure or arrival time), cancel one
  of several bookings, and rebook onto another date. Queries name passengers, not ids, so the agent
  has to look them up.
The reference solution is what a careful agent would call.

In v1 all splits share one world, so two splits can ask the same question (every credit lookup names one of
40 passengers). `generate(..., exclude=...)` redraws a task that asks one of the excluded questions
(`questions`): the environment passes the held-out splits' questions when it generates train tasks. In v2
every task has its own world (`world.generate_task_world`), and splits cannot share a question.
"""

from __future__ import annotations

import calendar
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

from env_service.environments.flights.world import AIRLINES, AIRPORTS, Flight, Passenger, World

KINDS = ("book_cheapest", "book_constrained", "cancel", "rebook")  # tier 3
TIER_KINDS: dict[int, tuple[str, ...]] = {
    1: ("fare_lookup", "credit_lookup", "id_lookup"),
    2: ("book_by_id", "cancel_by_id"),
    3: KINDS,
}
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
    tier: int = 3
    # Tier 1: the value the text answer must state, and values it must not state (the route's other
    # fares, the other credit amounts, other ids), so that pasting a whole search result does not pass.
    answer: str | None = None
    wrong_answers: tuple[str, ...] = ()
    # v2: the task's own world (None in v1, where every task shares the environment's).
    world: World | None = field(default=None, compare=False, repr=False)


Question = tuple[str, ...]


def questions(task: FlightTask) -> frozenset[Question]:
    """What a task asks, as keys two tasks share when they ask the same thing: its query word for word,
    and what it is about whatever the wording: a lookup's kind and entity (the route and date for a fare,
    the passenger for credit and id), a change's goal (who books which flight, whose booking of which
    flight is cancelled, which booking is moved onto which flight). So `book_by_id` for P1003 and
    `book_cheapest` naming P1003's passenger ask the same question when they book the same flight."""
    goal: Question
    if task.kind == "fare_lookup":
        args = task.reference[0][1]
        goal = ("fare", args["origin"], args["destination"], args["date"])
    elif task.kind in ("credit_lookup", "id_lookup"):
        goal = (task.kind.removesuffix("_lookup"), task.passenger_id)
    elif task.kind in ("book_cheapest", "book_constrained", "book_by_id"):
        goal = ("book", task.passenger_id, str(task.target_flight))
    elif task.kind in ("cancel", "cancel_by_id"):
        goal = ("cancel", task.passenger_id, str(task.target_flight))
    elif task.kind == "rebook":
        goal = ("rebook", task.passenger_id, task.preload[0][1], str(task.target_flight))
    else:
        raise ValueError(f"no question key for flights task kind {task.kind!r}")
    return frozenset({("query", task.query), goal})


def _cheapest(flights: list[Flight], seats: Callable[[Flight], int]) -> Flight | None:
    """The unique cheapest flight with a seat, or None when there is none or a tie."""
    available = sorted((f for f in flights if seats(f) > 0), key=lambda f: f.price)
    if not available or (len(available) > 1 and available[0].price == available[1].price):
        return None
    return available[0]


def _where(code: str) -> str:
    return f"{AIRPORTS[code]} ({code})"


def _day(date: str) -> str:
    return f"{calendar.month_name[int(date[5:7])]} {int(date[8:])}, {date[:4]}"


class TaskGenerator:
    def __init__(self, world: World, seed: int) -> None:
        self.world, self.seed = world, seed

    def generate(self, split: str, index: int, tier: int | None = None,
                 exclude: Collection[Question] = frozenset()) -> FlightTask:
        """Task `index` of a split; `tier` None is the original id scheme (`train-0007`, tier 3).

        A tier-3 task draws from the same seed with or without the tier in its id, so `train-t3-0007`
        is `train-0007` renamed; tiers 1 and 2 draw from their own seeds. A draw asking a question in
        `exclude` is skipped like one without a unique answer: the same rng goes on, so a task whose
        first good draw was not excluded is the task it always was."""
        salt = "" if tier in (None, 3) else f":t{tier}"
        rng = random.Random(f"flights:{self.seed}:{split}:{index}{salt}")
        kinds = TIER_KINDS[tier or 3]
        kind = kinds[index % len(kinds)]
        task_id = f"{split}-{index:04d}" if tier is None else f"{split}-t{tier}-{index:04d}"
        excluded = 0
        # Redraw until the sampled situation has a unique answer and is not excluded. The bound is generous
        # because exclusion can leave few entities (a handful of the 40 passengers for a credit lookup).
        for _ in range(200 if not exclude else 5000):
            task = getattr(self, f"_{kind}")(rng, task_id)
            if task is None:
                continue
            if exclude and not questions(task).isdisjoint(exclude):
                excluded += 1
                continue
            return replace(task, tier=tier or 3)
        if excluded:
            raise ValueError(f"could not generate flights task {task_id}: every {kind} question drawn is already "
                             f"asked by another split ({excluded} draws excluded; test avoids validation's questions, "
                             "train avoids both); make the validation and test splits smaller or use fewer "
                             "tier-1 tasks")
        raise RuntimeError(f"could not generate flights task {task_id}; try another seed")

    # ------------------------------------------------------------ helpers

    def _draw(self, rng: random.Random) -> tuple[Passenger, tuple[str, str, str]]:
        passenger = rng.choice(list(self.world.passengers.values()))
        return passenger, rng.choice(self.world.route_keys())

    @staticmethod
    def _lookup(passenger: Passenger) -> tuple[str, dict[str, Any]]:
        return ("get_passenger", {"name": passenger.name})

    @classmethod
    def _booking(cls, task_id: str, kind: str, query: str, passenger: Passenger, route: tuple[str, str, str],
                 target: Flight) -> FlightTask:
        """A task solved by looking the passenger up, searching the route and booking `target`."""
        origin, destination, date = route
        return FlightTask(task_id, kind, query, passenger.passenger_id, reference=(
            cls._lookup(passenger),
            ("search_flight", {"origin": origin, "destination": destination, "date": date}),
            ("book_ticket", {"passenger_id": passenger.passenger_id, "flight_id": target.flight_id}),
        ), target_flight=target.flight_id)

    # ------------------------------------------------------------ kinds

    def _book_cheapest(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        target = _cheapest(self.world.route_flights(origin, destination, date), lambda f: f.seats)
        if target is None or target.price > passenger.balance:
            return None
        query = (f"Please book the cheapest available flight from {_where(origin)} to {_where(destination)} "
                 f"on {_day(date)} for {passenger.name}.")
        return self._booking(task_id, "book_cheapest", query, passenger, (origin, destination, date), target)

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
        return self._booking(task_id, "book_constrained", query, passenger, (origin, destination, date), target)

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
        new_date = rng.choice([d for d in self.world.dates if d != date])
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

    # ------------------------------------------------------------ tier 1: one call, answered in text

    def _fare_lookup(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, (origin, destination, date) = self._draw(rng)
        flights = self.world.route_flights(origin, destination, date)
        target = _cheapest(flights, lambda f: f.seats)
        if target is None:
            return None
        query = (f"What is the cheapest fare with seats left from {_where(origin)} to {_where(destination)} on "
                 f"{_day(date)}? Reply with the price in USD.")
        others = sorted({str(f.price) for f in flights} - {str(target.price)})
        return FlightTask(task_id, "fare_lookup", query, passenger.passenger_id, reference=(
            ("search_flight", {"origin": origin, "destination": destination, "date": date}),
        ), target_flight=target.flight_id, answer=str(target.price), wrong_answers=tuple(others))

    def _credit_lookup(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, _ = self._draw(rng)
        query = f"How much travel credit does {passenger.name} have? Reply with the amount in USD."
        others = sorted({str(p.balance) for p in self.world.passengers.values()} - {str(passenger.balance)})
        return FlightTask(task_id, "credit_lookup", query, passenger.passenger_id, reference=(
            self._lookup(passenger),), answer=str(passenger.balance), wrong_answers=tuple(others))

    def _id_lookup(self, rng: random.Random, task_id: str) -> FlightTask | None:
        passenger, _ = self._draw(rng)
        query = f"What is the passenger id of {passenger.name}?"
        others = tuple(p for p in self.world.passengers if p != passenger.passenger_id)
        return FlightTask(task_id, "id_lookup", query, passenger.passenger_id, reference=(
            self._lookup(passenger),), answer=passenger.passenger_id, wrong_answers=others)

    # ------------------------------------------------------------ tier 2: two calls, ids given

    def _book_by_id(self, rng: random.Random, task_id: str) -> FlightTask | None:
        task = self._book_cheapest(rng, task_id)
        if task is None:
            return None
        search, book = task.reference[1], task.reference[2]
        origin, destination, date = (search[1][k] for k in ("origin", "destination", "date"))
        query = (f"Please book the cheapest available flight from {_where(origin)} to {_where(destination)} "
                 f"on {_day(date)} for passenger {task.passenger_id}.")
        return replace(task, kind="book_by_id", query=query, reference=(search, book))

    def _cancel_by_id(self, rng: random.Random, task_id: str) -> FlightTask | None:
        task = self._cancel(rng, task_id)
        if task is None or task.target_flight is None:
            return None
        number = task.target_flight.split("-")[0]
        query = (f"Passenger {task.passenger_id} can no longer take flight {number}. Cancel that booking and "
                 f"keep their other bookings.")
        return replace(task, kind="cancel_by_id", query=query, reference=task.reference[1:])
