"""The booking desk: one instance's mutable state and the tools an agent calls on it.

Hidden preconditions (not in the tool docs, discovered from error messages):
- `book_ticket` needs a fare quote: the flight's route and date must have been searched earlier
  in the episode (a search without a date quotes every date of the route);
- the passenger id must exist (look it up by name with `get_passenger`);
- the passenger's travel credit must cover the fare; cancelling refunds it.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from env_service.environments.flights.world import AIRPORTS, World


class ToolError(Exception):
    """A tool refused the call; the message is shown to the agent."""


@dataclass
class Order:
    order_id: str  # generated: differs between runs of the same episode
    passenger_id: str
    flight_id: str
    price: int
    status: str  # active / cancelled
    created_at: float  # wall clock: differs between runs too

    def public(self) -> dict[str, Any]:
        return {"order_id": self.order_id, "passenger_id": self.passenger_id, "flight_id": self.flight_id,
                "price": self.price, "status": self.status}


# name -> {argument: (json type, required, description)}: the single source of the tool docs and
# of argument checking.
TOOL_SPECS: dict[str, tuple[str, dict[str, tuple[str, bool, str]]]] = {
    "search_flight": ("Search flights on a route. Returns the flights with price and seats left, by departure.", {
        "origin": ("string", True, "IATA code of the departure airport, e.g. SFO"),
        "destination": ("string", True, "IATA code of the arrival airport, e.g. JFK"),
        "date": ("string", False, "travel date YYYY-MM-DD; omit to see every date"),
    }),
    "get_passenger": ("Look up a passenger by id or by full name.", {
        "passenger_id": ("string", False, "passenger id, e.g. P1001"),
        "name": ("string", False, "full name, e.g. Alice Wang"),
    }),
    "book_ticket": ("Book one economy seat on a flight for a passenger, paid from their travel credit.", {
        "passenger_id": ("string", True, "passenger id, e.g. P1001"),
        "flight_id": ("string", True, "flight id from search_flight, e.g. UA123-0603"),
    }),
    "cancel_order": ("Cancel an active order; the fare is refunded to the passenger's travel credit.", {
        "order_id": ("string", True, "order id from book_ticket or list_orders"),
    }),
    "list_orders": ("List a passenger's orders (active and cancelled).", {
        "passenger_id": ("string", True, "passenger id, e.g. P1001"),
    }),
}


def tool_docs() -> list[dict[str, Any]]:
    docs = []
    for name, (description, params) in TOOL_SPECS.items():
        properties = {arg: {"type": kind, "description": text} for arg, (kind, _, text) in params.items()}
        required = [arg for arg, (_, needed, _) in params.items() if needed]
        docs.append({"type": "function", "function": {
            "name": name, "description": description,
            # `call` refuses unknown arguments: the schema says so (a constrained decoder then writes none).
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": False}}})
    return docs


class FlightDesk:
    def __init__(self, world: World) -> None:
        self.world = world
        self.orders: dict[str, Order] = {}
        self.booked: dict[str, int] = {}  # flight id -> seats taken in this episode
        self.balances: dict[str, int] = {}  # passenger id -> credit, only once it changed
        self.quoted: set[tuple[str, str, str]] = set()  # (origin, destination, date) searched
        self._next_number = 1001
        self._salt = secrets.token_hex(2)

    def copy(self) -> FlightDesk:
        """An independent desk in this one's state, over the same world (read-only): a fork of the episode. Its
        order ids carry on this desk's numbering and salt, so ids the agent saw before the fork stay valid."""
        twin = FlightDesk.__new__(FlightDesk)
        twin.world = self.world
        twin.orders = {order_id: replace(order) for order_id, order in self.orders.items()}
        twin.booked, twin.balances, twin.quoted = dict(self.booked), dict(self.balances), set(self.quoted)
        twin._next_number, twin._salt = self._next_number, self._salt
        return twin

    # ------------------------------------------------------------ dispatch

    def call(self, name: str, arguments: dict[str, Any]) -> Any:
        spec = TOOL_SPECS.get(name)
        if spec is None:
            raise ToolError(f"unknown tool {name!r}; available tools: {', '.join(TOOL_SPECS)}")
        params = spec[1]
        unknown = sorted(set(arguments) - set(params))
        if unknown:
            raise ToolError(f"{name}: unknown argument(s) {', '.join(unknown)}; it takes {', '.join(params)}")
        missing = [arg for arg, (_, required, _) in params.items() if required and arg not in arguments]
        if missing:
            raise ToolError(f"{name}: missing required argument(s) {', '.join(missing)}")
        for arg, value in arguments.items():
            if value is not None and not isinstance(value, str):
                raise ToolError(f"{name}: {arg} must be a string, got {type(value).__name__}")
        return getattr(self, name)(**arguments)

    # ------------------------------------------------------------ tools

    def search_flight(self, origin: str, destination: str, date: str | None = None) -> list[dict[str, Any]]:
        origin, destination = origin.strip().upper(), destination.strip().upper()
        for code in (origin, destination):
            if code not in AIRPORTS:
                raise ToolError(f"unknown airport {code!r}; airports: {', '.join(AIRPORTS)}")
        dates = self.world.dates
        if date is not None and date not in dates:
            raise ToolError(f"no schedule for {date!r}; flights are sold for {dates[0]} to {dates[-1]}")
        dates = (date,) if date else dates
        found = []
        for day in dates:
            self.quoted.add((origin, destination, day))
            found.extend(f.public(self.seats_left(f.flight_id)) for f in self.world.route_flights(origin, destination, day))
        return found

    def get_passenger(self, passenger_id: str | None = None, name: str | None = None) -> dict[str, Any]:
        if passenger_id is None and name is None:
            raise ToolError("get_passenger: give passenger_id or name")
        if passenger_id is not None:
            passenger = self.world.passengers.get(passenger_id.strip().upper())
        else:
            wanted = " ".join(name.split()).lower()  # type: ignore[union-attr]
            passenger = next((p for p in self.world.passengers.values() if p.name.lower() == wanted), None)
        if passenger is None:
            raise ToolError(f"no passenger with {'id ' + repr(passenger_id) if passenger_id else 'name ' + repr(name)}")
        return {"passenger_id": passenger.passenger_id, "name": passenger.name, "tier": passenger.tier,
                "travel_credit": self.balance(passenger.passenger_id)}

    def book_ticket(self, passenger_id: str, flight_id: str) -> dict[str, Any]:
        passenger_id, flight_id = passenger_id.strip().upper(), flight_id.strip().upper()
        if passenger_id not in self.world.passengers:
            raise ToolError(f"booking failed: passenger id {passenger_id!r} does not exist "
                            "(look the passenger up with get_passenger)")
        flight = self.world.flights.get(flight_id)
        if flight is None:
            raise ToolError(f"booking failed: no flight {flight_id!r} (use a flight_id returned by search_flight)")
        if (flight.origin, flight.destination, flight.date) not in self.quoted:
            raise ToolError(f"booking failed: no fare quote for {flight_id} in this session; "
                            f"search {flight.origin} -> {flight.destination} on {flight.date} first")
        if self.seats_left(flight_id) <= 0:
            raise ToolError(f"booking failed: {flight_id} is sold out")
        if any(o.passenger_id == passenger_id and o.flight_id == flight_id and o.status == "active"
               for o in self.orders.values()):
            raise ToolError(f"booking failed: {passenger_id} already holds a seat on {flight_id}")
        credit = self.balance(passenger_id)
        if credit < flight.price:
            raise ToolError(f"booking failed: {passenger_id} has {credit} USD of travel credit, "
                            f"the fare is {flight.price} USD")
        order = self._new_order(passenger_id, flight_id, flight.price)
        self.balances[passenger_id] = credit - flight.price
        return {**order.public(), "travel_credit_left": self.balances[passenger_id]}

    def cancel_order(self, order_id: str) -> dict[str, Any]:
        order = self.orders.get(order_id.strip())
        if order is None:
            raise ToolError(f"no order {order_id!r} (list a passenger's orders with list_orders)")
        if order.status != "active":
            raise ToolError(f"order {order_id} is already {order.status}")
        order.status = "cancelled"
        self.booked[order.flight_id] -= 1
        self.balances[order.passenger_id] = self.balance(order.passenger_id) + order.price
        return {**order.public(), "refunded": order.price, "travel_credit": self.balances[order.passenger_id]}

    def list_orders(self, passenger_id: str) -> list[dict[str, Any]]:
        passenger_id = passenger_id.strip().upper()
        if passenger_id not in self.world.passengers:
            raise ToolError(f"passenger id {passenger_id!r} does not exist (look it up with get_passenger)")
        return [o.public() for o in self.orders.values() if o.passenger_id == passenger_id]

    # ------------------------------------------------------------ state

    def seats_left(self, flight_id: str) -> int:
        return self.world.flights[flight_id].seats - self.booked.get(flight_id, 0)

    def balance(self, passenger_id: str) -> int:
        return self.balances.get(passenger_id, self.world.passengers[passenger_id].balance)

    def preload_order(self, passenger_id: str, flight_id: str) -> Order:
        """An order that exists when the episode starts (paid before it)."""
        return self._new_order(passenger_id, flight_id, self.world.flights[flight_id].price)

    def _new_order(self, passenger_id: str, flight_id: str, price: int) -> Order:
        order_id = f"ORD{self._next_number}{self._salt.upper()}"
        self._next_number += 1
        order = Order(order_id, passenger_id, flight_id, price, "active", time.time())
        self.orders[order_id] = order
        self.booked[flight_id] = self.booked.get(flight_id, 0) + 1
        return order

    def snapshot(self) -> dict[str, Any]:
        """The full state, generated ids and timestamps included, plus its `comparable` view."""
        return {
            "orders": [{**o.public(), "created_at": o.created_at} for o in self.orders.values()],
            "travel_credit": dict(sorted(self.balances.items())),
            "seats_taken": {f: n for f, n in sorted(self.booked.items()) if n},
            "quoted_routes": sorted("/".join(key) for key in self.quoted),
            "comparable": self.comparable(),
        }

    def comparable(self) -> dict[str, Any]:
        """The state with generated ids and timestamps left out: two episodes that did the same
        bookings compare equal. Searches are not state (they change nothing a user could see)."""
        orders = sorted((o.passenger_id, o.flight_id, o.price, o.status) for o in self.orders.values())
        return {
            "orders": [{"passenger_id": p, "flight_id": f, "price": c, "status": s} for p, f, c, s in orders],
            "travel_credit": {pid: credit for pid, credit in sorted(self.balances.items())
                              if credit != self.world.passengers[pid].balance},
        }
