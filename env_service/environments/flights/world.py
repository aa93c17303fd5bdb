"""The flights world: a deterministic catalog of airports, flights and passengers.

The catalog is generated once per environment from its seed and never mutated: every instance
shares it and keeps only its own changes (orders, seats taken, balances), which keeps an
instance a few kilobytes.
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

    def route_flights(self, origin: str, destination: str, date: str) -> list[Flight]:
        return [self.flights[f] for f in self.routes.get((origin, destination, date), ())]

    def route_keys(self) -> list[tuple[str, str, str]]:
        return sorted(self.routes)


def _clock(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def generate_world(seed: int = 7, routes: int = 36) -> World:
    rng = random.Random(seed)
    codes = list(AIRPORTS)
    pairs = [(a, b) for a in codes for b in codes if a != b]
    chosen = sorted(rng.sample(pairs, min(routes, len(pairs))))
    flights: dict[str, Flight] = {}
    route_index: dict[tuple[str, str, str], tuple[str, ...]] = {}
    used_numbers: set[str] = set()
    for origin, destination in chosen:
        base_minutes = rng.randint(70, 360)  # nonstop block time of this route
        for date in DATES:
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
    passengers = {}
    for i in range(40):
        pid = f"P{1001 + i}"
        name = f"{_FIRST[i % len(_FIRST)]} {_LAST[(i * 7 + i // len(_FIRST)) % len(_LAST)]}"
        tier = rng.choice(("basic", "basic", "silver", "gold"))
        passengers[pid] = Passenger(pid, name, tier, rng.choice((400, 800, 1200, 2500)))
    return World(flights, route_index, passengers)
