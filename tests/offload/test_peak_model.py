"""The step's account (peak.py), by hand on a small step."""

from fuseops.offload.peak import BACKWARD_WORKING, GroupBytes, peak, points


def test_points_follow_the_forward_the_backward_and_the_weight_gradients():
    assert BACKWARD_WORKING == 2
    groups = [GroupBytes(10, 10, 1), GroupBytes(20, 5, 2), GroupBytes(30, 0, 4)]
    got = dict((where, b) for b, where in points(100, groups, keep_last=1, lag=0))
    # Forward: group 0's copies settle as group 2 starts.
    assert got["forward of group 0"] == 110 and got["forward of group 1"] == 130
    assert got["forward of group 2"] == 100 + 60 - 10
    # Backward of g: what groups before g - 1 kept, g - 1 and g whole, g's working memory
    # (BACKWARD_WORKING = 2 times its saved bytes), the weight gradients of later groups.
    assert got["backward of group 2"] == 100 + 0 + 20 + 90
    assert got["backward of group 1"] == 100 + 10 + 60 + 4
    assert got["backward of group 0"] == 100 + 30 + 6
    assert got["weight gradients"] == 107


def test_the_peak_names_its_point_and_the_lowest_moves_all_but_the_kept_groups():
    groups = [GroupBytes(50, 0, 1), GroupBytes(50, 0, 1), GroupBytes(10, 0, 1)]
    p = peak(0, groups, keep_last=1, lag=0)
    # Groups 0 and 1 whole, group 1's working memory, group 2's weight gradients.
    assert (p.bytes, p.where) == (201, "backward of group 1")
    # Everything but the last group moved: backward of group 1 still holds groups 0 and 1.
    assert p.lowest == 201
    p = peak(0, groups, keep_last=1, lag=1)
    assert p.where == "backward of group 1"


def test_weight_gradients_larger_than_the_activations_make_the_peak():
    p = peak(0, [GroupBytes(1, 0, 100), GroupBytes(1, 0, 100)], keep_last=1, lag=0)
    # The backward of group 0 holds 3 bytes and group 1's 100 of weight gradients.
    assert (p.bytes, p.where, p.lowest) == (200, "weight gradients", 200)
