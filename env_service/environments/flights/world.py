"""The flights world: a deterministic catalog of airports, flights and passengers.

A catalog is never mutated: every instance of a task shares it and keeps only its own changes (orders,
seats taken, balances), which keeps an instance a few kilobytes.

Two versions:
- v1 (`generate_world`): one catalog per environment, shared by every task of every split (40 passengers,
  four credit amounts). Kept so that results measured on it stay reproducible;
- v2 (`generate_task_world`): one catalog per task, drawn from the task's seed. Each split draws its
  passengers' names from its own name pool and sells flights on its own dates, so no question a held-out
  task asks (a passenger, a route on a date) can be answered from anything a train task shows. Credits take
  hundreds of values and ids are random, so a call-free guess is almost never right.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

AIRPORTS: dict[str, str] = {
    "SFO": "San Francisco", "JFK": "New York", "LAX": "Los Angeles", "ORD": "Chicago", "SEA": "Seattle",
    "BOS": "Boston", "ATL": "Atlanta", "DFW": "Dallas", "DEN": "Denver", "MIA": "Miami",
}
AIRLINES: dict[str, str] = {"UA": "United", "AA": "American", "DL": "Delta", "AS": "Alaska", "B6": "JetBlue"}
DATES: tuple[str, ...] = ("2025-06-02", "2025-06-03", "2025-06-04", "2025-06-05", "2025-06-06")
_FIRST = ("Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam",
          "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara")
_LAST = ("Wang", "Garcia", "Smith", "Okafor", "Novak", "Kim", "Rossi", "Haddad", "Silva", "Berg")


@dataclass(frozen=True, slots=True)
class Flight:
    flight_id: str  # airline code + number + date, e.g. UA123-0603
    airline: str
    origin: str
    destination: str
    date: str
    depart: str  # HH:MM local
    arrive: str
    duration_min: int
    stops: int
    price: int  # USD, economy
    seats: int  # seats left in the catalog (instances track their own bookings on top)

    def public(self, seats_left: int) -> dict:
        return {"flight_id": self.flight_id, "airline": AIRLINES[self.airline], "origin": self.origin,
                "destination": self.destination, "date": self.date, "depart": self.depart, "arrive": self.arrive,
                "duration_min": self.duration_min, "stops": self.stops, "price": self.price,
                "seats_left": seats_left}


@dataclass(frozen=True, slots=True)
class Passenger:
    passenger_id: str
    name: str
    tier: str  # basic / silver / gold
    balance: int  # USD travel credit at the start of every episode


@dataclass(frozen=True)
class World:
    flights: dict[str, Flight]
    routes: dict[tuple[str, str, str], tuple[str, ...]]  # (origin, destination, date) -> flight ids by departure
    passengers: dict[str, Passenger]
    dates: tuple[str, ...] = DATES  # the days flights are sold for

    def route_flights(self, origin: str, destination: str, date: str) -> list[Flight]:
        return [self.flights[f] for f in self.routes.get((origin, destination, date), ())]

    def route_keys(self) -> list[tuple[str, str, str]]:
        return sorted(self.routes)


def _clock(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _schedule(rng: random.Random, routes: int, dates: tuple[str, ...]) -> tuple[dict[str, Flight],
                                                                              dict[tuple[str, str, str], tuple[str, ...]]]:
    codes = list(AIRPORTS)
    pairs = [(a, b) for a in codes for b in codes if a != b]
    chosen = sorted(rng.sample(pairs, min(routes, len(pairs))))
    flights: dict[str, Flight] = {}
    route_index: dict[tuple[str, str, str], tuple[str, ...]] = {}
    used_numbers: set[str] = set()
    for origin, destination in chosen:
        base_minutes = rng.randint(70, 360)  # nonstop block time of this route
        for date in dates:
            ids = []
            for _ in range(rng.randint(3, 6)):
                airline = rng.choice(list(AIRLINES))
                number = f"{airline}{rng.randint(100, 2999)}"
                while number in used_numbers:
                    number = f"{airline}{rng.randint(100, 2999)}"
                used_numbers.add(number)
                stops = 0 if rng.random() < 0.6 else 1
                duration = base_minutes + stops * rng.randint(60, 150) + rng.randint(-10, 25)
                depart = rng.randrange(5 * 60, 22 * 60, 5)
                price = int(round((60 + base_minutes * rng.uniform(0.55, 0.95)) * (0.8 if stops else 1.0), -0))
                seats = 0 if rng.random() < 0.12 else rng.randint(1, 9)
                flight = Flight(f"{number}-{date[5:7]}{date[8:]}", airline, origin, destination, date,
                                _clock(depart), _clock(depart + duration), duration, stops, price, seats)
                flights[flight.flight_id] = flight
                ids.append(flight)
            ids.sort(key=lambda f: (f.depart, f.flight_id))
            route_index[(origin, destination, date)] = tuple(f.flight_id for f in ids)
    return flights, route_index


def generate_world(seed: int = 7, routes: int = 36) -> World:
    """The v1 world: one catalog for the whole environment."""
    rng = random.Random(seed)
    flights, route_index = _schedule(rng, routes, DATES)
    passengers = {}
    for i in range(40):
        pid = f"P{1001 + i}"
        name = f"{_FIRST[i % len(_FIRST)]} {_LAST[(i * 7 + i // len(_FIRST)) % len(_LAST)]}"
        tier = rng.choice(("basic", "basic", "silver", "gold"))
        passengers[pid] = Passenger(pid, name, tier, rng.choice((400, 800, 1200, 2500)))
    return World(flights, route_index, passengers)


# ---------------------------------------------------------------- v2: a world per task

# 60 first and 48 last names, cut into one pool per split: full names of two splits never meet.
FIRST_NAMES: tuple[str, ...] = (
    "Alice", "Bruno", "Chen", "Dana", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam", "Maya",
    "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sven", "Tara", "Uma", "Victor", "Wen", "Ximena", "Yusuf", "Zara",
    "Amir", "Bea", "Caleb", "Dmitri", "Esme", "Femi", "Gustav", "Hana", "Ivan", "Jia", "Kofi", "Lena", "Mateo",
    "Noor", "Oscar", "Priya", "Rafael", "Sana", "Tomas", "Ugo", "Vera", "Wanjiru", "Yara", "Zeno", "Aiko", "Boris",
    "Clara", "Deniz", "Emeka", "Freya", "Goran", "Hedda", "Isaac", "Juno",
)
LAST_NAMES: tuple[str, ...] = (
    "Wang", "Garcia", "Smith", "Okafor", "Novak", "Kim", "Rossi", "Haddad", "Silva", "Berg", "Costa", "Dubois",
    "Eriksen", "Fischer", "Gupta", "Horvat", "Ito", "Jensen", "Kowalski", "Larsen", "Mendes", "Nakamura", "Olsen",
    "Petrov", "Quispe", "Reyes", "Sato", "Tanaka", "Ueda", "Vargas", "Weber", "Yilmaz", "Zhou", "Abara", "Becker",
    "Castro", "Diallo", "Evans", "Fontaine", "Gomez", "Hansen", "Iqbal", "Jovanovic", "Keller", "Lindqvist",
    "Moreau", "Nguyen", "Ortiz",
)
SPLIT_ORDER: tuple[str, ...] = ("train", "validation", "test")
# Each split sells flights in its own month, so a (route, date) a held-out task asks about exists in no train world.
SPLIT_MONTH: dict[str, int] = {"train": 6, "validation": 7, "test": 8}
TASK_WORLD_ROUTES = 12
TASK_WORLD_PASSENGERS = 16


def split_name_pool(split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The first and last names a split's worlds draw from: train gets half, validation and test a quarter each."""
    if split not in SPLIT_MONTH:
        raise KeyError(f"no flights split {split!r}; splits: {', '.join(SPLIT_ORDER)}")
    cuts = {"train": (0, 2), "validation": (2, 3), "test": (3, 4)}[split]

    def part(names: tuple[str, ...]) -> tuple[str, ...]:
        quarter = len(names) // 4
        return names[cuts[0] * quarter: cuts[1] * quarter]
    return part(FIRST_NAMES), part(LAST_NAMES)


def split_dates(split: str) -> tuple[str, ...]:
    if split not in SPLIT_MONTH:
        raise KeyError(f"no flights split {split!r}; splits: {', '.join(SPLIT_ORDER)}")
    month = SPLIT_MONTH[split]
    return tuple(f"2025-{month:02d}-{day:02d}" for day in range(2, 7))


def generate_task_world(seed: str, split: str, routes: int = TASK_WORLD_ROUTES,
                        passengers: int = TASK_WORLD_PASSENGERS) -> World:
    """One task's own v2 world, from the task's seed string and its split's names and dates."""
    rng = random.Random(f"flights-v2-world:{seed}")
    dates = split_dates(split)
    flights, route_index = _schedule(rng, routes, dates)
    first, last = split_name_pool(split)
    names = rng.sample([f"{f} {surname}" for f in first for surname in last], passengers)
    numbers = rng.sample(range(1000, 10000), passengers)
    people = {}
    for name, number in zip(names, numbers, strict=True):
        pid = f"P{number}"
        tier = rng.choice(("basic", "basic", "silver", "gold"))
        people[pid] = Passenger(pid, name, tier, rng.randrange(300, 5001, 5))
    return World(flights, route_index, people, dates)
