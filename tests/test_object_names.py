"""Class ids of names-only annotation sources (VOC, CSV objects): 0 background, 1…N sorted, earlier ids kept."""

from __future__ import annotations

import pytest

from beam_pipeline.annotations import objects
from beam_pipeline.annotations.objects import BACKGROUND, UNASSIGNED, Annotations, Obj
from beam_pipeline.images.options import Geometry

pytestmark = pytest.mark.unit

SAME_10X10 = Geometry(10, 10, 10, 10)  # a 10 x 10 image recorded as it is stored


def test_names_get_ids_one_to_n_sorted_after_the_background() -> None:
    labels = objects.name_labels(["dog", "cat", "dog", "zebra"])
    assert labels == [BACKGROUND, "cat", "dog", "zebra"]
    assert objects.categories_from_labels(labels) == ((1, "cat"), (2, "dog"), (3, "zebra"))


def test_an_earlier_runs_ids_stay_and_new_names_follow_sorted() -> None:
    prior = [BACKGROUND, "dog", "zebra"]
    assert objects.name_labels(["cat", "zebra", "ant"], prior) == [BACKGROUND, "dog", "zebra", "ant", "cat"]


def test_unassigned_objects_take_their_id_from_the_runs_label_list() -> None:
    objs = (
        Obj(bbox=(0, 0, 5, 5), label=UNASSIGNED, text="dog"),
        Obj(bbox=(1, 1, 4, 4), label=7, text="kept as the source gave it"),
    )
    features = objects.object_features(Annotations("a", 10, 10, objs), SAME_10X10, {"dog": 2})
    assert features[objects.CLASS_LABEL] == [2, 7]
    with pytest.raises(ValueError, match="no id"):
        objects.object_features(Annotations("a", 10, 10, objs[:1]), SAME_10X10, {})


def test_object_names_are_those_of_unassigned_objects_only() -> None:
    objs = (Obj(bbox=(0, 0, 1, 1), label=UNASSIGNED, text="a"), Obj(bbox=(0, 0, 1, 1), label=3, text="b"))
    assert list(objects.object_names(Annotations("x", 2, 2, objs))) == ["a"]
    assert list(objects.object_names(None)) == []


@pytest.mark.parametrize("name", ["", "  ", "a\nb", "a\x0bb", "a\u2028b", BACKGROUND, 3])
def test_a_class_name_that_cannot_be_a_labels_line_is_invalid(name: object) -> None:
    assert isinstance(objects.check_class_name(name), objects.Invalid)


def test_a_plain_class_name_is_valid() -> None:
    assert objects.check_class_name("traffic light") is None


def test_an_earlier_coco_runs_unused_lines_keep_their_ids_and_are_no_categories() -> None:
    prior = [BACKGROUND, "person", "unused_2", "car"]
    labels = objects.name_labels(["car", "dog"], prior)
    assert labels == [*prior, "dog"]
    assert objects.categories_from_labels(labels, prior) == ((1, "person"), (3, "car"), (4, "dog"))
