"""``BasicOp``'s class codes: the fuser matches op types by them (``fuseops.fuser``), so each op
class has its own, and the code leads back to the class."""

from fuseops import ops
from fuseops.ops.op import OP_CLASSES, BasicOp


def test_every_op_class_has_its_own_code_that_leads_back_to_it():
    class Local(ops.Identity):
        pass

    assert OP_CLASSES[Local.class_code] is Local
    assert Local.class_code != ops.Identity.class_code
    assert all(OP_CLASSES[c.class_code] is c for c in OP_CLASSES)
    assert all(issubclass(c, BasicOp) for c in OP_CLASSES)
    assert ops.Linear(2, 2).class_code == ops.Linear.class_code
